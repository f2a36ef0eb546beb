//! PostgreSQL's errors as backend-neutral ones: one lowercase line that says which
//! failure it is (the server is down, the password was refused, the connection dropped
//! mid-transaction, another writer held the lock), with the values a person needs.

use std::path::PathBuf;

use crate::error::{BackendError, BackendErrorKind, Error};

/// SQLSTATEs that mean "try again": serialization failure, deadlock, lock not available
/// (a `lock_timeout`), query cancelled (a `statement_timeout`).
const BUSY: &[&str] = &["40001", "40P01", "55P03", "57014"];

/// A driver error during a transaction, as [`Error::Backend`].
pub(crate) fn backend(e: postgres::Error) -> Error {
    let (kind, message) = describe(&e);
    Error::Backend(BackendError::new(kind, format!("postgres: {message}")))
}

/// Whether `e` says the connection is gone (closed, an I/O failure, or the server
/// ending the session: SQLSTATE class 08 or 57P).
pub(crate) fn is_lost(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P")
        }
        None => e.is_closed() || io_error(e).is_some(),
    }
}

/// What went wrong, and its kind.
pub(crate) fn describe(e: &postgres::Error) -> (BackendErrorKind, String) {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let kind = if BUSY.contains(&code) {
            BackendErrorKind::Busy
        } else if code.starts_with("23") {
            BackendErrorKind::Constraint
        } else if code.starts_with("XX") {
            BackendErrorKind::Corrupt
        } else if code.starts_with("08") {
            BackendErrorKind::Unavailable
        } else if code.starts_with("53") || code.starts_with("58") {
            BackendErrorKind::Io
        } else if code == "25P02" {
            return (
                BackendErrorKind::Other,
                "an earlier statement of this transaction failed and PostgreSQL aborted the \
                 transaction, though its error was not passed on (caught?): nothing of it was \
                 committed (sqlstate 25P02)"
                    .into(),
            );
        } else if code.starts_with("57P") {
            return (
                BackendErrorKind::Unavailable,
                format!(
                    "the server ended the connection ({}): nothing of this transaction was committed",
                    db.message()
                ),
            );
        } else {
            BackendErrorKind::Other
        };
        let mut message = format!("{} (sqlstate {code})", db.message());
        if code == "40P01" {
            message.push_str(
                ": this transaction and another waited for each other, and PostgreSQL ended \
                 this one; nothing of it was committed; try again",
            );
        } else if kind == BackendErrorKind::Busy {
            message.push_str(": another writer held the lock past the busy timeout; try again");
        }
        return (kind, message);
    }
    if e.is_closed() || io_error(e).is_some() {
        return (
            BackendErrorKind::Unavailable,
            format!(
                "connection to the server dropped mid-transaction ({}): nothing of this \
                 transaction was committed (if it dropped during the commit, the commit may \
                 have happened)",
                one_line(e)
            ),
        );
    }
    (BackendErrorKind::Other, one_line(e))
}

/// The driver's message with its causes, on one line.
pub(super) fn one_line(e: &postgres::Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s.replace('\n', " ").to_lowercase()
}

fn io_error(e: &postgres::Error) -> Option<&std::io::Error> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        source = cause.source();
    }
    None
}

/// A failure to connect, as [`Error::Open`] naming `url` (password hidden) and saying
/// which failure it is; `password` says where a refused password came from.
pub(crate) fn connect(
    e: postgres::Error,
    url: &str,
    config: &postgres::Config,
    password: &super::libpq::Password,
) -> Error {
    let user = config.get_user().unwrap_or("(default user)");
    let hosts = || {
        let ports = config.get_ports();
        config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                match h {
                    postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
                    postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let reason = match (e.as_db_error(), io_error(&e)) {
        (Some(db), _) if db.code().code() == "28P01" => {
            format!(
                "password refused for user {user:?} (sqlstate 28P01{})",
                password.refused_note()
            )
        }
        (Some(db), _) if db.code().code() == "28000" => {
            format!(
                "the server refused user {user:?}: {} (sqlstate 28000)",
                db.message()
            )
        }
        (Some(db), _) if db.code().code() == "57P03" => {
            format!(
                "the server is starting up or shutting down: {}",
                db.message()
            )
        }
        (Some(db), _) if db.code().code() == "3D000" => {
            let name = config.get_dbname().unwrap_or(user);
            format!(
                "{} (sqlstate 3D000): precedent makes tables, not databases; create it \
                 first (createdb {name}, or CREATE DATABASE {name})",
                db.message()
            )
        }
        (Some(db), _) => format!("{} (sqlstate {})", db.message(), db.code().code()),
        (None, Some(io)) if io.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "server down: connection refused at {} (is PostgreSQL running there?)",
            hosts()
        ),
        (None, Some(io)) if io.kind() == std::io::ErrorKind::NotFound => format!(
            "server down: no socket at {} (is PostgreSQL running there?)",
            hosts()
        ),
        (None, Some(io))
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            // A server being stopped or started takes the connection and drops it
            // before it can say 57P03.
            format!(
                "the server at {} dropped the connection as it was opened ({}): is it starting up or shutting down?",
                hosts(),
                io.kind()
            )
        }
        (None, Some(io)) if io.kind() == std::io::ErrorKind::TimedOut => {
            format!("no answer from {} (connect timed out)", hosts())
        }
        _ if e.as_db_error().is_none() && one_line(&e).contains("password missing") => {
            format!(
                "the server asks a password for user {user:?}, and {}",
                password.missing_note()
            )
        }
        _ => format!("cannot connect to {}: {}", hosts(), one_line(&e)),
    };
    open(url, reason)
}

/// [`Error::Open`] for `url`, with its password hidden.
pub(crate) fn open(url: &str, reason: String) -> Error {
    Error::Open {
        path: PathBuf::from(redact(url)),
        reason,
    }
}

/// `url` with its password hidden (see [`crate::store::shown_path`]).
pub(crate) fn redact(url: &str) -> String {
    crate::store::shown_path(std::path::Path::new(url))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        // A password with a `/` or a `?`, which the driver takes whole up to the `@`.
        assert_eq!(redact("postgres://u:a/b@h/d"), "postgres://u:***@h/d");
        assert_eq!(
            redact("postgres://u:p?w@h/d?sslmode=require"),
            "postgres://u:***@h/d?sslmode=require"
        );
        // Every password in the query.
        assert_eq!(
            redact("postgres://h/d?sslpassword=x&password=secret"),
            "postgres://h/d?sslpassword=***&password=***"
        );
        assert_eq!(
            redact("postgresql://h/db?user=u&password=x&sslmode=disable"),
            "postgresql://h/db?user=u&password=***&sslmode=disable"
        );
    }
}
