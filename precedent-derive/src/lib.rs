//! `#[derive(FactType)]`: declares a struct as a precedent typed fact.
//!
//! ```ignore
//! #[derive(Serialize, Deserialize, FactType)]
//! #[fact(type = "Shop.Order")]
//! struct Order {
//!     #[fact(role)]
//!     shop: Ref<Shop>,          // Arity::One
//!     #[fact(role)]
//!     replaces: Option<Ref<Order>>, // Arity::Optional
//!     #[fact(role = "items")]
//!     lines: Vec<Ref<Line>>,    // Arity::Many, stored under the role "items"
//!     id: u64,                  // a field
//! }
//! ```
//!
//! The arity of a role follows its Rust type: `Option<..>` is optional, `Vec<..>` many,
//! anything else one. A role renamed with `#[fact(role = "name")]` must carry the same
//! name for serde (`#[serde(rename = "name")]`), since roles are read from the serialised
//! form.

use proc_macro::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitStr, Type, parse_macro_input};

/// Implements `precedent::query::FactType` from `#[fact(type = "..")]` on the struct and
/// `#[fact(role)]` / `#[fact(role = "..")]` on its predecessor fields.
#[proc_macro_derive(FactType, attributes(fact))]
pub fn derive_fact_type(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let mut type_name: Option<LitStr> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("fact")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("type") {
                type_name = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error("expected `type = \"Fact.Type\"`"))
            }
        })?;
    }
    let Some(type_name) = type_name else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "add #[fact(type = \"Fact.Type\")] to name the fact type",
        ));
    };
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "FactType derives only on structs",
        ));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "FactType needs named fields",
        ));
    };
    let mut roles = Vec::new();
    for field in &fields.named {
        let mut role: Option<String> = None;
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("fact")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("role") {
                    role = Some(match meta.value() {
                        Ok(v) => v.parse::<LitStr>()?.value(),
                        Err(_) => field
                            .ident
                            .as_ref()
                            .map(|i| i.to_string())
                            .unwrap_or_default(),
                    });
                    Ok(())
                } else {
                    Err(meta.error("expected `role` or `role = \"name\"`"))
                }
            })?;
        }
        if let Some(role) = role {
            let arity = match outer_type_name(&field.ty).as_deref() {
                Some("Option") => quote!(::precedent::query::Arity::Optional),
                Some("Vec") => quote!(::precedent::query::Arity::Many),
                _ => quote!(::precedent::query::Arity::One),
            };
            roles.push(quote!((#role, #arity)));
        }
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::precedent::query::FactType for #ident #ty_generics #where_clause {
            const TYPE: &'static str = #type_name;
            const PREDECESSORS: &'static [(&'static str, ::precedent::query::Arity)] = &[#(#roles),*];
        }
    })
}

/// The last path segment of a type: `Option` for `std::option::Option<T>`.
fn outer_type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}
