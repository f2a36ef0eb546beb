//! TLS to PostgreSQL as libpq's `sslmode` says, over rustls (with `ring`).
//!
//! The driver's URL parser knows `sslmode=disable|prefer|require` and refuses every
//! other TLS parameter, so [`split`] takes them off the URL first: `sslmode` (also
//! `verify-ca` and `verify-full`), `sslrootcert`, `sslcert`, `sslkey`, each once. The
//! modes, as libpq's:
//! - `disable`: plain text.
//! - `prefer` (the default): TLS when the server offers it, else plain; the server's
//!   certificate is not checked.
//! - `require`: TLS or nothing; the certificate is not checked, unless `sslrootcert` is
//!   given, when it is checked as `verify-ca` does (libpq does the same).
//! - `verify-ca`: TLS, and the certificate must chain to `sslrootcert`.
//! - `verify-full`: as `verify-ca`, and it must name the host connected to.
//!
//! `sslrootcert` is a PEM file of CA certificates (default `~/.postgresql/root.crt`, for
//! the two verifying modes); `sslcert` and `sslkey` a client certificate and its key
//! (PEM), sent when the server asks for one. `sslrootcert=system` (libpq 16's) is the
//! operating system's CA bundle, as OpenSSL finds it: the file `SSL_CERT_FILE` names, else
//! the first of the distributions' usual places ([`SYSTEM_BUNDLES`]); it makes
//! `verify-full` the default mode and refuses a weaker one, as libpq does, since a public
//! CA vouches for any name it signed. A parameter the URL leaves out is taken from
//! libpq's variable for it, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` or `PGSSLKEY`
//! (`libpq.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
pub(crate) use tokio_postgres_rustls::MakeRustlsConnect;

use super::libpq::Env;

/// How a connection uses TLS (`sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS parameters of a URL.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) mode: Mode,
    root: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// The parameters this module takes off a URL.
const OURS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];
/// Where the distributions keep the system's CA bundle (Debian and Ubuntu, Fedora and
/// RHEL, openSUSE, older RHEL, Alpine and the BSDs), as OpenSSL's builds look for it.
const SYSTEM_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/ssl/cert.pem",
];

/// libpq's environment variable for each of [`OURS`], read when the URL has none.
const VARS: [&str; 4] = ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"];

/// Takes the TLS parameters off `url`: the URL the driver parses, and the settings; a
/// parameter the URL does not give is read from `env` ([`VARS`]).
///
/// # Errors
/// A one-line reason for a bad `sslmode`, a parameter given twice, or a key without a
/// certificate.
pub(crate) fn split(url: &str, env: Env<'_>) -> Result<(String, Settings), String> {
    // The query starts at the first `?` after the credentials, which may hold one.
    let after_userinfo = url.find("://").map_or(0, |s| {
        s + 3 + crate::store::url_userinfo(&url[s + 3..]).map_or(0, |at| at + 1)
    });
    let (base, query) = match url[after_userinfo..].find('?') {
        Some(q) => (&url[..after_userinfo + q], &url[after_userinfo + q + 1..]),
        None => (url, ""),
    };
    // A TLS parameter anywhere else (a password with a raw `&` or `=` in it) would reach
    // the driver, whose mode this one overrides: refused rather than weakened.
    if let Some(k) = OURS.iter().find(|k| base.contains(&format!("{k}="))) {
        return Err(format!(
            "{k} is outside the url's query; percent-encode special characters in the \
             user and password"
        ));
    }
    let mut kept = Vec::new();
    let mut found: [Option<String>; 4] = Default::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match OURS.iter().position(|o| *o == k) {
            Some(i) if found[i].is_some() => return Err(format!("{k} is given twice")),
            Some(i) => found[i] = Some(decode(v).map_err(|e| format!("{k}: {e}"))?),
            None => kept.push(pair),
        }
    }
    // Where `sslmode` came from, for its error.
    let mode_from = if found[0].is_some() {
        ""
    } else {
        "PGSSLMODE: "
    };
    for (value, var) in found.iter_mut().zip(VARS) {
        if value.is_none() {
            *value = env(var);
        }
    }
    let [mode, root, cert, key] = found;
    let system = root.as_deref() == Some("system");
    let mode = match mode.as_deref() {
        None if system => Mode::VerifyFull,
        Some(m) if system && m != "verify-full" => {
            return Err(format!(
                "{mode_from}sslmode {m} is weaker than sslrootcert=system allows: only \
                 verify-full (the default with it), as with libpq"
            ));
        }
        None | Some("prefer") => Mode::Prefer,
        Some("disable") => Mode::Disable,
        Some("allow") => Mode::Prefer,
        Some("require") if root.is_some() => Mode::VerifyCa,
        Some("require") => Mode::Require,
        Some("verify-ca") => Mode::VerifyCa,
        Some("verify-full") => Mode::VerifyFull,
        Some(other) => {
            return Err(format!(
                "{mode_from}sslmode {other:?} is none of disable, allow, prefer, require, \
                 verify-ca, verify-full"
            ));
        }
    };
    if key.is_some() != cert.is_some() {
        return Err("sslcert and sslkey go together".into());
    }
    let url = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    let root = match system {
        true => Some(system_bundle(env)?),
        false => root.map(PathBuf::from),
    };
    let settings = Settings {
        mode,
        root,
        cert: cert.map(PathBuf::from),
        key: key.map(PathBuf::from),
    };
    Ok((url, settings))
}

/// The system's CA bundle: `SSL_CERT_FILE`, else the first of [`SYSTEM_BUNDLES`] there.
fn system_bundle(env: Env<'_>) -> Result<PathBuf, String> {
    if let Some(file) = env("SSL_CERT_FILE") {
        return Ok(PathBuf::from(file));
    }
    SYSTEM_BUNDLES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "sslrootcert=system: no CA bundle in any of {} (set SSL_CERT_FILE to one)",
                SYSTEM_BUNDLES.join(", ")
            )
        })
}

/// `%XX` decoded.
fn decode(v: &str) -> Result<String, String> {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = v
                .get(i + 1..i + 3)
                .ok_or("a % not followed by two hex digits")?;
            out.push(
                u8::from_str_radix(hex, 16).map_err(|_| "a % not followed by two hex digits")?,
            );
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "not utf-8 once decoded".into())
}

impl Settings {
    /// The driver's mode: it knows only whether TLS is off, tried or required.
    pub(crate) fn driver_mode(&self) -> postgres::config::SslMode {
        match self.mode {
            Mode::Disable => postgres::config::SslMode::Disable,
            Mode::Prefer => postgres::config::SslMode::Prefer,
            _ => postgres::config::SslMode::Require,
        }
    }

    /// The connector for these settings, `None` with `sslmode=disable`.
    ///
    /// # Errors
    /// A one-line reason naming the file that cannot be read or holds no certificate.
    pub(crate) fn connector(&self) -> Result<Option<MakeRustlsConnect>, String> {
        if self.mode == Mode::Disable {
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("tls: {e}"))?;
        let algorithms = provider.signature_verification_algorithms;
        let any_name = |chain| Arc::new(AnyName { chain, algorithms });
        let builder = match self.mode {
            Mode::Prefer | Mode::Require => builder
                .dangerous()
                .with_custom_certificate_verifier(any_name(None)),
            _ => {
                let roots = Arc::new(self.roots()?);
                let full = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| format!("tls: {e}"))?;
                match self.mode {
                    Mode::VerifyFull => builder.with_webpki_verifier(full),
                    _ => builder
                        .dangerous()
                        .with_custom_certificate_verifier(any_name(Some(full))),
                }
            }
        };
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let certs = CertificateDer::pem_file_iter(cert)
                    .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| format!("sslcert {}: {e}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("sslkey {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| format!("sslcert/sslkey: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(MakeRustlsConnect::new(config)))
    }

    /// The CA certificates of `sslrootcert` (or `~/.postgresql/root.crt`).
    fn roots(&self) -> Result<RootCertStore, String> {
        let path = match &self.root {
            Some(p) => p.clone(),
            None => std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".postgresql/root.crt"))
                .ok_or("sslmode verify-ca and verify-full need sslrootcert")?,
        };
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(&path)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(format!("sslrootcert {shown}: no certificate in it"));
        }
        Ok(roots)
    }
}

/// The verifier of `prefer` and `require` (`chain: None`: any certificate) and of
/// `verify-ca` (the chain is checked, the name is not: webpki checks the chain first, so a
/// name error comes only for a certificate that chains to the roots). The handshake's
/// signatures are checked either way.
#[derive(Debug)]
struct AnyName {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::libpq::test_env as env;
    use super::*;

    /// A password may hold a `?` (libpq and the driver take the credentials up to the
    /// `@`): the query is the one after them, and its `sslmode` is kept. A TLS parameter
    /// the query does not hold (a raw `&` in a password) is refused, never dropped.
    #[test]
    fn the_query_starts_after_the_credentials() {
        let (url, s) = split("postgres://u:p?w@h/d?sslmode=require", &env(&[])).unwrap();
        assert_eq!(
            (url.as_str(), s.mode),
            ("postgres://u:p?w@h/d", Mode::Require)
        );
        let (url, s) = split("postgres://u:a/b@h/d?sslmode=verify-full", &env(&[])).unwrap();
        assert_eq!(
            (url.as_str(), s.mode),
            ("postgres://u:a/b@h/d", Mode::VerifyFull)
        );
        let (url, s) = split("postgres://h/d?sslmode=require", &env(&[])).unwrap();
        assert_eq!((url.as_str(), s.mode), ("postgres://h/d", Mode::Require));
        let err = split("postgres://u:x&sslmode=disable@h/d", &env(&[])).unwrap_err();
        assert!(err.contains("sslmode is outside the url's query"), "{err}");
    }

    #[test]
    fn what_the_url_leaves_out_comes_from_libpqs_variables() {
        let vars = [
            ("PGSSLMODE", "verify-full"),
            ("PGSSLROOTCERT", "/ca.pem"),
            ("PGSSLCERT", "/me.pem"),
            ("PGSSLKEY", "/me.key"),
        ];
        let (url, s) = split("postgres://h/d?application_name=a", &env(&vars)).unwrap();
        assert_eq!(url, "postgres://h/d?application_name=a");
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(s.root.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(s.cert.as_deref(), Some(Path::new("/me.pem")));
        assert_eq!(s.key.as_deref(), Some(Path::new("/me.key")));
        // The URL's own come first.
        let (url, s) = split(
            "postgres://h/d?sslmode=disable&sslrootcert=%2Fx",
            &env(&vars),
        )
        .unwrap();
        assert_eq!(url, "postgres://h/d");
        assert_eq!(
            (s.mode, s.root.as_deref()),
            (Mode::Disable, Some(Path::new("/x")))
        );
        // Without either, libpq's default.
        assert_eq!(
            split("postgres://h/d", &env(&[])).unwrap().1.mode,
            Mode::Prefer
        );
    }

    #[test]
    fn sslrootcert_system_is_the_systems_bundle_and_verify_full() {
        let file = [("SSL_CERT_FILE", "/bundle.pem")];
        let (_, s) = split("postgres://h/d?sslrootcert=system", &env(&file)).unwrap();
        assert_eq!(s.mode, Mode::VerifyFull);
        assert_eq!(s.root.as_deref(), Some(Path::new("/bundle.pem")));
        let (_, s) = split(
            "postgres://h/d",
            &env(&[file[0], ("PGSSLROOTCERT", "system")]),
        )
        .unwrap();
        assert_eq!(s.mode, Mode::VerifyFull);
        let ok = split(
            "postgres://h/d?sslrootcert=system&sslmode=verify-full",
            &env(&file),
        );
        assert_eq!(ok.unwrap().1.mode, Mode::VerifyFull);
        for weaker in ["disable", "prefer", "require", "verify-ca"] {
            let url = format!("postgres://h/d?sslrootcert=system&sslmode={weaker}");
            let err = split(&url, &env(&file)).unwrap_err();
            assert!(err.contains("only verify-full"), "{err}");
        }
        // Without SSL_CERT_FILE, the first bundle of the usual places that is there.
        let found = SYSTEM_BUNDLES.iter().find(|p| Path::new(p).is_file());
        let got = split("postgres://h/d?sslrootcert=system", &env(&[]));
        match found {
            Some(p) => assert_eq!(got.unwrap().1.root.as_deref(), Some(Path::new(p))),
            None => assert!(got.unwrap_err().contains("SSL_CERT_FILE")),
        }
    }

    #[test]
    fn a_bad_sslmode_says_where_it_came_from() {
        let err = split("postgres://h/d", &env(&[("PGSSLMODE", "strict")])).unwrap_err();
        assert!(err.starts_with("PGSSLMODE: sslmode \"strict\""), "{err}");
        let err = split("postgres://h/d?sslmode=strict", &env(&[])).unwrap_err();
        assert!(err.starts_with("sslmode \"strict\""), "{err}");
    }
}
