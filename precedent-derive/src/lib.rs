//! `#[derive(FactType)]`: declares a struct as a precedent typed fact.
//!
//! ```ignore
//! #[derive(Serialize, Deserialize, FactType)]
//! #[fact(type = "Shop.Order")]
//! struct Order {
//!     shop: Ref<Shop>,              // role "shop", Arity::One
//!     replaces: Option<Ref<Order>>, // role "replaces", Arity::Optional
//!     #[fact(role = "items")]
//!     #[serde(rename = "items")]
//!     lines: Vec<Ref<Line>>,        // role "items", Arity::Many
//!     id: u64,                      // a field
//! }
//! ```
//!
//! A field whose type holds references to facts is a predecessor role, named after the
//! field: `Ref<_>` (`Arity::One`), `Option<Ref<_>>` (`Arity::Optional`), or a `Vec`,
//! `BTreeSet` or `HashSet` of `Ref<_>` (`Arity::Many`). Every other field is a fact field.
//! `#[fact(role = "name")]` renames a role, and must carry the same name for serde
//! (`#[serde(rename = "name")]`), since roles are read from the serialised form.
//! `#[fact(role)]` makes a role of a field of another type (one that serialises as a hash),
//! and `#[fact(field)]` keeps a `Ref` a fact field: its hash stored as text, with no edge.

use proc_macro::TokenStream;
use quote::quote;
use syn::{
    Data, DeriveInput, Field, Fields, GenericArgument, LitStr, PathArguments, PathSegment, Type,
    parse_macro_input,
};

/// Implements `precedent::query::FactType` from `#[fact(type = "..")]` on the struct, with
/// its `Ref` fields (and those marked `#[fact(role)]`) as predecessor roles.
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
        if let Some((role, arity)) = field_role(field)? {
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

/// The role a field declares, with its arity; `None` for a fact field.
///
/// A field is a role when it says so (`#[fact(role)]`, `#[fact(role = "name")]`) or when
/// its type holds references to facts (`Ref<_>`, `Option<Ref<_>>`, a `Vec`, `BTreeSet` or
/// `HashSet` of `Ref<_>`): a reference stored as a fact field would be a hash in a string,
/// with no edge for queries to walk. `#[fact(field)]` keeps such a field a fact field.
fn field_role(field: &Field) -> syn::Result<Option<(String, proc_macro2::TokenStream)>> {
    let mut named: Option<String> = None;
    let (mut role, mut plain) = (false, false);
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("fact")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("role") {
                role = true;
                if let Ok(v) = meta.value() {
                    named = Some(v.parse::<LitStr>()?.value());
                }
                Ok(())
            } else if meta.path.is_ident("field") {
                plain = true;
                Ok(())
            } else {
                Err(meta.error("expected `role`, `role = \"name\"` or `field`"))
            }
        })?;
    }
    if role && plain {
        return Err(syn::Error::new_spanned(
            field,
            "a field is either #[fact(role)] or #[fact(field)], not both",
        ));
    }
    let (outer, holds_refs) = shape(&field.ty);
    if plain || !(role || holds_refs) {
        return Ok(None);
    }
    let arity = match outer.as_deref() {
        Some("Option") => quote!(::precedent::query::Arity::Optional),
        Some("Vec" | "BTreeSet" | "HashSet") => quote!(::precedent::query::Arity::Many),
        _ => quote!(::precedent::query::Arity::One),
    };
    let name = named.unwrap_or_else(|| {
        let ident = field
            .ident
            .as_ref()
            .map(|i| i.to_string())
            .unwrap_or_default();
        // A raw identifier (`r#type`) serialises without its prefix.
        ident.trim_start_matches("r#").to_string()
    });
    Ok(Some((name, arity)))
}

/// The last path segment of a type (`Option` for `std::option::Option<T>`), and whether
/// the type is a `Ref<_>` or one of the containers above around a `Ref<_>`.
fn shape(ty: &Type) -> (Option<String>, bool) {
    let Some(last) = last_segment(ty) else {
        return (None, false);
    };
    let outer = last.ident.to_string();
    let holds_refs = match outer.as_str() {
        "Ref" => true,
        "Option" | "Vec" | "BTreeSet" | "HashSet" => first_type_argument(last)
            .and_then(last_segment)
            .is_some_and(|s| s.ident == "Ref"),
        _ => false,
    };
    (Some(outer), holds_refs)
}

fn last_segment(ty: &Type) -> Option<&PathSegment> {
    match ty {
        Type::Path(p) if p.qself.is_none() => p.path.segments.last(),
        _ => None,
    }
}

fn first_type_argument(segment: &PathSegment) -> Option<&Type> {
    let PathArguments::AngleBracketed(args) = &segment.arguments else {
        return None;
    };
    args.args.iter().find_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}
