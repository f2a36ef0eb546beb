//! Bearer tokens: the token file and what each token may do.
//!
//! The file is JSON (see `docs/protocol.md`, "Tokens"):
//!
//! ```json
//! {"tokens": [
//!   {"name": "laptop", "token": "k3p...", "read": true, "write": true,
//!    "types": ["Shop.Order", "Shop.Order.Paid"]},
//!   {"name": "dashboard", "token": "r9x...", "read": true}
//! ]}
//! ```
//!
//! `read`, `write` and `admin` default to `false`; `types`, when present, lists the only
//! fact types the token may push; `work` (`true`, or a list of queue names) lets it claim
//! and finish the inputs of queues over HTTP (`/v1/queues/...`); `admin` lets it redrive
//! and discard queue entries from the console or the JSON API. A server started without a
//! token file lets every request read and
//! write, as the peer `anonymous`.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// One token's grant.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The peer's name: in the quarantine, metrics and logs.
    pub name: String,
    /// The secret the peer sends as `Authorization: Bearer <token>`.
    pub token: String,
    /// May pull, fetch and read info and metrics.
    #[serde(default)]
    pub read: bool,
    /// May push.
    #[serde(default)]
    pub write: bool,
    /// When present, the only fact types a push may carry.
    #[serde(default)]
    pub types: Option<Vec<String>>,
    /// The queues whose inputs it may claim, extend, complete, fail and poison.
    #[serde(default)]
    pub work: Work,
    /// May redrive and discard dead-lettered and poison queue entries
    /// (`POST /v1/queues/NAME/redrive|discard`).
    #[serde(default)]
    pub admin: bool,
}

/// A token's work permission: none (the default), every queue (`true`), or the queues
/// named.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Work {
    /// `true` for every queue, `false` for none.
    All(bool),
    /// Only these queues.
    Queues(Vec<String>),
}

impl Default for Work {
    fn default() -> Work {
        Work::All(false)
    }
}

impl Grant {
    /// Whether this grant lets a push carry a fact of `type_name`.
    pub fn may_write_type(&self, type_name: &str) -> bool {
        self.write
            && self
                .types
                .as_ref()
                .is_none_or(|t| t.iter().any(|x| x == type_name))
    }

    /// Whether this grant lets a worker take and finish the inputs of `queue`.
    pub fn may_work(&self, queue: &str) -> bool {
        match &self.work {
            Work::All(all) => *all,
            Work::Queues(names) => names.iter().any(|n| n == queue),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<Grant>,
}

/// The tokens a server accepts; `None` inside means the server is open.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    grants: Option<Vec<(blake3::Hash, Grant)>>,
}

/// What a request may do, as decided from its `Authorization` header.
#[derive(Debug, PartialEq, Eq)]
pub enum Access<'a> {
    /// No token file: anyone may do anything, as `anonymous`.
    Open,
    /// A known token.
    Granted(&'a Grant),
    /// No token, a malformed header, or a token not in the file.
    Unauthorized,
}

impl Tokens {
    /// Every request is allowed (no token file).
    pub fn open() -> Tokens {
        Tokens { grants: None }
    }

    /// Tokens from a list of grants.
    ///
    /// # Errors
    /// [`Error::SyncConfig`] for an empty or repeated token or name.
    pub fn new(grants: Vec<Grant>) -> Result<Tokens> {
        let mut seen = std::collections::HashSet::new();
        for g in &grants {
            if g.token.is_empty() || g.name.is_empty() {
                return Err(Error::SyncConfig {
                    reason: "a token and its name must not be empty".into(),
                });
            }
            if !seen.insert(g.token.clone()) || !seen.insert(format!("\0name:{}", g.name)) {
                return Err(Error::SyncConfig {
                    reason: format!("token {:?} is listed twice", g.name),
                });
            }
        }
        Ok(Tokens {
            grants: Some(
                grants
                    .into_iter()
                    .map(|g| (blake3::hash(g.token.as_bytes()), g))
                    .collect(),
            ),
        })
    }

    /// Reads a token file.
    ///
    /// # Errors
    /// [`Error::SyncConfig`] naming the file for a file that cannot be read or parsed.
    pub fn from_file(path: &Path) -> Result<Tokens> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::SyncConfig {
            reason: format!("cannot read token file {}: {e}", path.display()),
        })?;
        let file: TokenFile = serde_json::from_str(&text).map_err(|e| Error::SyncConfig {
            reason: format!("token file {}: {e}", path.display()),
        })?;
        Tokens::new(file.tokens)
    }

    /// Whether a token file is in force.
    pub fn is_open(&self) -> bool {
        self.grants.is_none()
    }

    /// Decides a request's access from its `Authorization` header value.
    pub fn check(&self, authorization: Option<&[u8]>) -> Access<'_> {
        let Some(grants) = &self.grants else {
            return Access::Open;
        };
        let Some(token) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return Access::Unauthorized;
        };
        // blake3::Hash compares in constant time, so the lookup leaks no prefix of a token.
        let given = blake3::hash(token);
        let mut found = None;
        for (h, g) in grants {
            if *h == given {
                found = Some(g);
            }
        }
        found.map_or(Access::Unauthorized, Access::Granted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_tokens_and_types() {
        let t = Tokens::new(vec![Grant {
            name: "a".into(),
            token: "s3cret".into(),
            read: true,
            write: true,
            types: Some(vec!["Shop".into()]),
            work: Work::Queues(vec!["ship".into()]),
            admin: false,
        }])
        .unwrap();
        assert_eq!(t.check(None), Access::Unauthorized);
        assert_eq!(t.check(Some(b"Bearer nope")), Access::Unauthorized);
        let Access::Granted(g) = t.check(Some(b"Bearer s3cret")) else {
            panic!("token not accepted")
        };
        assert!(g.may_write_type("Shop"));
        assert!(!g.may_write_type("Shop.Order"));
        assert!(g.may_work("ship") && !g.may_work("bill"));
        assert_eq!(Tokens::open().check(None), Access::Open);
    }
}
