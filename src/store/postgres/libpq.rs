//! What libpq takes from outside a connection URL, for the parts the URL leaves out: its
//! environment variables and its password file. So `--db postgres://app@db/hub` with the
//! password in `~/.pgpass` (or `PGPASSWORD`) connects as it does for `psql`, and no
//! password has to stand in a command line or a config file.
//!
//! - **Environment**, each read only when the URL does not give the part (the URL wins):
//!   `PGHOST` (several hosts comma-separated; one starting with `/` is a directory of Unix
//!   sockets), `PGPORT` (comma-separated as well: one for every host, or one for all;
//!   used when the URL gives no port at all), `PGDATABASE`, `PGUSER`, `PGPASSWORD`,
//!   `PGOPTIONS`, `PGAPPNAME`, `PGCONNECT_TIMEOUT` (seconds); and, in `tls.rs`,
//!   `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`. An empty variable counts as
//!   unset.
//! - **Defaults** as libpq's: no host at all is the Unix socket directory
//!   `/var/run/postgresql` (Debian's libpq) or else `/tmp` (upstream's), whichever exist,
//!   in that order; no user is the operating system's user; no database is the user's
//!   name.
//! - **The password file**, `PGPASSFILE` or else `~/.pgpass`, read when neither the URL nor
//!   `PGPASSWORD` gives a password: lines `hostname:port:database:username:password`, `*`
//!   in any of the first four matching anything, `\:` and `\\` for a colon or backslash,
//!   lines starting with `#` ignored; the first line that matches wins, tried for each host
//!   in turn. A Unix socket directory matches its own path or `localhost`. Like libpq, a
//!   file that group or others may read or write (permissions beyond `0600`) is not read,
//!   and a connection refused for want of a password then says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

use postgres::config::Host;

/// Looks up an environment variable; the process's in [`process_env`], a map in tests.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment, an empty variable counting as unset.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the password of a connection came from, for the message of a refused one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Password {
    /// The URL's.
    Url,
    /// `PGPASSWORD`.
    Env,
    /// A line of this password file.
    File(PathBuf),
    /// None; the reason a password file was not read, if one was passed over.
    Missing { passed_over: Option<String> },
}

impl Password {
    /// Where a refused password came from, as a clause of a message (empty for the URL's).
    pub(crate) fn refused_note(&self) -> String {
        match self {
            Password::Env => "; the password came from PGPASSWORD".into(),
            Password::File(p) => format!("; the password came from {}", p.display()),
            Password::Url | Password::Missing { .. } => String::new(),
        }
    }

    /// Why no password was sent, as a clause of a message.
    pub(crate) fn missing_note(&self) -> String {
        let mut s = "neither the url nor PGPASSWORD gives one, and no line of the password \
                     file (PGPASSFILE, else ~/.pgpass) matches"
            .to_string();
        if let Password::Missing {
            passed_over: Some(why),
        } = self
        {
            s.push_str("; ");
            s.push_str(why);
        }
        s
    }
}

/// `url` with `PGPORT`'s ports written into its hosts, when it names hosts and gives no
/// port for any of them (the driver's parser would take 5432 for each, which would hide
/// that none was given). A URL with no host takes its ports in [`complete`].
///
/// # Errors
/// A one-line reason for a `PGPORT` that is not a list of port numbers, one for all the
/// URL's hosts or one for each.
pub(crate) fn port_in_url(url: &str, env: Env<'_>) -> Result<String, String> {
    let Some(var) = env("PGPORT") else {
        return Ok(url.to_string());
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(url.to_string());
    };
    let (userinfo, rest) = match crate::store::url_userinfo(rest) {
        Some(at) => rest.split_at(at + 1),
        None => ("", rest),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (hosts, tail) = rest.split_at(end);
    let query = tail.split_once('?').map_or("", |(_, q)| q);
    let port_param = query.split('&').any(|p| p.starts_with("port="));
    let chunks: Vec<&str> = hosts.split(',').collect();
    let has_port = |c: &&str| match c.strip_prefix('[') {
        Some(v6) => v6.contains("]:"),
        None => c.contains(':'),
    };
    if hosts.is_empty() || port_param || chunks.iter().any(has_port) {
        return Ok(url.to_string());
    }
    let ports = parse_ports(&var)?;
    if ports.len() != 1 && ports.len() != chunks.len() {
        return Err(format!(
            "PGPORT {var:?} gives {} ports for the url's {} hosts",
            ports.len(),
            chunks.len()
        ));
    }
    let hosts: Vec<String> = chunks
        .iter()
        .enumerate()
        .map(|(i, h)| format!("{h}:{}", ports.get(i).unwrap_or(&ports[0])))
        .collect();
    Ok(format!("{scheme}://{userinfo}{}{tail}", hosts.join(",")))
}

fn parse_ports(var: &str) -> Result<Vec<u16>, String> {
    var.split(',')
        .map(|p| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| format!("PGPORT {p:?} is not a port number"))
        })
        .collect()
}

/// Fills in what `config` (parsed from a URL) leaves out, from `env` and then libpq's
/// defaults, and finds its password; returns where the password came from.
///
/// # Errors
/// A one-line reason for a `PGPORT` or `PGCONNECT_TIMEOUT` that is not a number.
pub(crate) fn complete(config: &mut postgres::Config, env: Env<'_>) -> Result<Password, String> {
    if config.get_hosts().is_empty() {
        match env("PGHOST") {
            Some(hosts) => {
                for h in hosts.split(',').filter(|h| !h.is_empty()) {
                    config.host(h);
                }
            }
            None => {
                for dir in ["/var/run/postgresql", "/tmp"] {
                    if Path::new(dir).is_dir() {
                        config.host(dir);
                    }
                }
            }
        }
    }
    if config.get_ports().is_empty()
        && let Some(ports) = env("PGPORT")
    {
        for port in parse_ports(&ports)? {
            config.port(port);
        }
    }
    if config.get_user().is_none() {
        match env("PGUSER") {
            Some(u) => config.user(&u),
            // The driver would take the same name as it connects; taken here, the
            // password file and the messages know it.
            None => match whoami::username() {
                Ok(u) => config.user(&u),
                Err(_) => config,
            },
        };
    }
    if config.get_dbname().is_none()
        && let Some(d) = env("PGDATABASE")
    {
        config.dbname(&d);
    }
    if config.get_options().is_none()
        && let Some(o) = env("PGOPTIONS")
    {
        config.options(&o);
    }
    if config.get_application_name().is_none()
        && let Some(a) = env("PGAPPNAME")
    {
        config.application_name(&a);
    }
    if config.get_connect_timeout().is_none()
        && let Some(t) = env("PGCONNECT_TIMEOUT")
    {
        let secs = t
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("PGCONNECT_TIMEOUT {t:?} is not a number of seconds"))?;
        // As libpq: zero or less waits for ever.
        if secs > 0 {
            config.connect_timeout(Duration::from_secs(secs as u64));
        }
    }
    if config.get_password().is_some() {
        return Ok(Password::Url);
    }
    if let Some(p) = env("PGPASSWORD") {
        config.password(p);
        return Ok(Password::Env);
    }
    let file = match env("PGPASSFILE") {
        Some(f) => PathBuf::from(f),
        None => match env("HOME") {
            Some(home) => Path::new(&home).join(".pgpass"),
            None => return Ok(Password::Missing { passed_over: None }),
        },
    };
    Ok(match read_file(&file) {
        Read::Lines(text) => match find(config, &text) {
            Some(password) => {
                config.password(password);
                Password::File(file)
            }
            None => Password::Missing { passed_over: None },
        },
        Read::PassedOver(why) => Password::Missing {
            passed_over: Some(why),
        },
        Read::Absent => Password::Missing { passed_over: None },
    })
}

/// A password file, read or not.
enum Read {
    Lines(String),
    /// There, but not read: why.
    PassedOver(String),
    Absent,
}

fn read_file(path: &Path) -> Read {
    let Ok(meta) = std::fs::metadata(path) else {
        return Read::Absent;
    };
    if !meta.is_file() {
        return Read::PassedOver(format!(
            "the password file {} is not a plain file",
            path.display()
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Read::PassedOver(format!(
                "the password file {} was not read: its permissions are {:04o}, and like \
                 libpq precedent reads it only when group and others have no access \
                 (chmod 0600 it)",
                path.display(),
                mode & 0o7777
            ));
        }
    }
    match std::fs::read_to_string(path) {
        Ok(text) => Read::Lines(text),
        Err(e) => Read::PassedOver(format!(
            "the password file {} could not be read: {e}",
            path.display()
        )),
    }
}

/// The password of the first line of `text` that matches one of `config`'s hosts, tried
/// in turn, with its port, database and user.
fn find(config: &postgres::Config, text: &str) -> Option<String> {
    let user = config.get_user()?;
    let db = config.get_dbname().unwrap_or(user);
    let ports = config.get_ports();
    config.get_hosts().iter().enumerate().find_map(|(i, h)| {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let port = port.to_string();
        let names: Vec<String> = match h {
            Host::Tcp(h) => vec![h.clone()],
            #[cfg(unix)]
            Host::Unix(p) => vec![p.display().to_string(), "localhost".into()],
        };
        text.lines().find_map(|line| {
            let [host, p, d, u, password] = fields(line)?;
            let matches = |field: &str, value: &str| field == "*" || field == value;
            (names.iter().any(|n| matches(&host, n))
                && matches(&p, &port)
                && matches(&d, db)
                && matches(&u, user))
            .then_some(password)
        })
    })
}

/// The five fields of a password file line, unescaped; `None` for a comment, a blank
/// line or one with fewer fields. The password is the rest of the line after the fourth
/// colon.
fn fields(line: &str) -> Option<[String; 5]> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let mut out: [String; 5] = Default::default();
    let mut k = 0;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out[k].push(chars.next().unwrap_or('\\')),
            ':' if k < 4 => k += 1,
            c => out[k].push(c),
        }
    }
    (k == 4).then_some(out)
}

/// An environment of `pairs` alone, for tests ([`Env`]).
#[cfg(test)]
pub(crate) fn test_env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k: &str| map.get(k).cloned()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::test_env as env;
    use super::*;

    fn config(url: &str) -> postgres::Config {
        postgres::Config::from_str(url).unwrap()
    }

    /// `url` as the backend opens it with `env`: its ports, then the rest.
    fn opened(url: &str, env: Env<'_>) -> Result<(postgres::Config, Password), String> {
        let mut c = config(&port_in_url(url, env)?);
        let password = complete(&mut c, env)?;
        Ok((c, password))
    }

    /// `PGPORT` goes after the hosts, not into a password holding a `/` or a `?`.
    #[test]
    fn the_port_goes_after_the_hosts_whatever_the_password() {
        let vars = [("PGPORT", "6543")];
        for url in ["postgres://u:a/b@h/d", "postgres://u:p?w@h/d"] {
            let (c, _) = opened(url, &env(&vars)).unwrap();
            assert_eq!(c.get_ports(), [6543], "{url}");
            assert_eq!(
                c.get_hosts(),
                [postgres::config::Host::Tcp("h".into())],
                "{url}"
            );
            assert_eq!(c.get_dbname(), Some("d"), "{url}");
        }
    }

    fn pass_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let path = dir.join("pgpass");
        std::fs::write(&path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        path
    }

    #[test]
    fn a_line_is_split_at_unescaped_colons() {
        assert_eq!(
            fields(r"db\:1:5432:*:app:pa\:ss\\word:x"),
            Some([
                "db:1".into(),
                "5432".into(),
                "*".into(),
                "app".into(),
                r"pa:ss\word:x".into()
            ])
        );
        assert_eq!(fields("# h:1:d:u:p"), None);
        assert_eq!(fields(""), None);
        assert_eq!(fields("h:1:d:u"), None, "four fields are not a line");
        assert_eq!(fields("h:1:d:u:p\r").unwrap()[4], "p");
    }

    #[test]
    fn the_url_wins_over_the_environment() {
        let mut c = config("postgres://u:pw@h1:7/d?application_name=mine");
        let e = env(&[
            ("PGHOST", "other"),
            ("PGPORT", "9"),
            ("PGUSER", "x"),
            ("PGDATABASE", "y"),
            ("PGPASSWORD", "z"),
            ("PGAPPNAME", "theirs"),
        ]);
        assert_eq!(complete(&mut c, &e), Ok(Password::Url));
        assert_eq!(c.get_hosts(), &[Host::Tcp("h1".into())]);
        assert_eq!(c.get_ports(), &[7]);
        assert_eq!(c.get_user(), Some("u"));
        assert_eq!(c.get_dbname(), Some("d"));
        assert_eq!(c.get_password(), Some(&b"pw"[..]));
        assert_eq!(c.get_application_name(), Some("mine"));
    }

    #[test]
    fn the_environment_fills_what_the_url_leaves_out() {
        let mut c = config("postgres://");
        let e = env(&[
            ("PGHOST", "a,/run/sock"),
            ("PGPORT", "5433,5434"),
            ("PGUSER", "app"),
            ("PGDATABASE", "hub"),
            ("PGPASSWORD", "secret"),
            ("PGOPTIONS", "-c statement_timeout=5000"),
            ("PGAPPNAME", "hub-1"),
            ("PGCONNECT_TIMEOUT", "7"),
        ]);
        assert_eq!(complete(&mut c, &e), Ok(Password::Env));
        assert_eq!(
            c.get_hosts(),
            &[Host::Tcp("a".into()), Host::Unix("/run/sock".into())]
        );
        assert_eq!(c.get_ports(), &[5433, 5434]);
        assert_eq!(c.get_user(), Some("app"));
        assert_eq!(c.get_dbname(), Some("hub"));
        assert_eq!(c.get_password(), Some(&b"secret"[..]));
        assert_eq!(c.get_options(), Some("-c statement_timeout=5000"));
        assert_eq!(c.get_application_name(), Some("hub-1"));
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(7)));
    }

    #[test]
    fn pgport_gives_the_ports_of_a_url_that_gives_none() {
        let e = env(&[("PGPORT", "6001")]);
        let (c, _) = opened("postgres://u@a,b/d", &e).unwrap();
        assert_eq!(c.get_ports(), &[6001, 6001]);
        let (c, _) = opened("postgres://u@a:7,b/d", &e).unwrap();
        assert_eq!(
            c.get_ports(),
            &[7, 5432],
            "a url with a port keeps the driver's way"
        );
        let (c, _) = opened("postgres://u@[::1]/d?sslmode=disable", &e).unwrap();
        assert_eq!(c.get_ports(), &[6001]);
        let (c, _) = opened("postgres://u@a,b/d", &env(&[("PGPORT", "1,2")])).unwrap();
        assert_eq!(c.get_ports(), &[1, 2]);
        let err = opened("postgres://u@a,b/d", &env(&[("PGPORT", "1,2,3")]));
        assert!(err.unwrap_err().contains("3 ports for the url's 2 hosts"));
    }

    #[test]
    fn a_bad_port_or_timeout_in_the_environment_is_refused() {
        let err = opened("postgres://h", &env(&[("PGPORT", "54x")])).map(|_| ());
        assert_eq!(err, Err("PGPORT \"54x\" is not a port number".into()));
        let err = opened("postgres://", &env(&[("PGPORT", "0x")])).map(|_| ());
        assert_eq!(err, Err("PGPORT \"0x\" is not a port number".into()));
        let err = complete(
            &mut config("postgres://h"),
            &env(&[("PGCONNECT_TIMEOUT", "soon")]),
        );
        assert!(err.unwrap_err().contains("PGCONNECT_TIMEOUT"));
    }

    #[test]
    fn no_user_is_the_systems_user() {
        let mut c = config("postgres://h/d");
        complete(&mut c, &env(&[("HOME", "/nonexistent")])).unwrap();
        assert_eq!(c.get_user(), whoami::username().ok().as_deref());
    }

    #[test]
    fn the_first_matching_line_of_the_password_file_gives_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let file = pass_file(
            dir.path(),
            "# hub\n\
             db.example:5432:hub:app:not this one\n\
             other:*:*:*:nor this\n\
             db.example:*:hub:app:right\n\
             *:*:*:*:too late\n",
            0o600,
        );
        let file_env = [("PGPASSFILE", file.to_str().unwrap())];
        let mut c = config("postgres://app@db.example:6000/hub");
        assert_eq!(
            complete(&mut c, &env(&file_env)),
            Ok(Password::File(file.clone()))
        );
        assert_eq!(c.get_password(), Some(&b"right"[..]));
        // The database defaults to the user's name; the wildcard line matches it.
        let mut c = config("postgres://someone@elsewhere");
        complete(&mut c, &env(&file_env)).unwrap();
        assert_eq!(c.get_password(), Some(&b"too late"[..]));
        // PGPASSWORD comes before the file.
        let mut c = config("postgres://app@db.example:6000/hub");
        let with_env = [file_env[0], ("PGPASSWORD", "from env")];
        assert_eq!(complete(&mut c, &env(&with_env)), Ok(Password::Env));
        assert_eq!(c.get_password(), Some(&b"from env"[..]));
    }

    #[test]
    fn a_socket_directory_matches_its_path_or_localhost() {
        let dir = tempfile::tempdir().unwrap();
        let file = pass_file(dir.path(), "localhost:5432:hub:app:local\n", 0o600);
        let mut c = config("postgres://app@%2Frun%2Fpg/hub");
        complete(&mut c, &env(&[("PGPASSFILE", file.to_str().unwrap())])).unwrap();
        assert_eq!(c.get_password(), Some(&b"local"[..]));
        let file = pass_file(dir.path(), "/run/pg:5432:hub:app:by path\n", 0o600);
        let mut c = config("postgres://app@%2Frun%2Fpg/hub");
        complete(&mut c, &env(&[("PGPASSFILE", file.to_str().unwrap())])).unwrap();
        assert_eq!(c.get_password(), Some(&b"by path"[..]));
    }

    #[cfg(unix)]
    #[test]
    fn a_password_file_others_may_read_is_passed_over_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = pass_file(dir.path(), "*:*:*:*:secret\n", 0o644);
        let mut c = config("postgres://app@h/hub");
        let got = complete(&mut c, &env(&[("PGPASSFILE", file.to_str().unwrap())])).unwrap();
        assert_eq!(c.get_password(), None);
        let Password::Missing {
            passed_over: Some(why),
        } = &got
        else {
            panic!("{got:?}")
        };
        assert!(why.contains("0644") && why.contains("chmod 0600"), "{why}");
        assert!(got.missing_note().contains(why.as_str()));
        // ~/.pgpass, when PGPASSFILE is not set; none there is no password and no note.
        let mut c = config("postgres://app@h/hub");
        let got = complete(&mut c, &env(&[("HOME", "/nonexistent")])).unwrap();
        assert_eq!(got, Password::Missing { passed_over: None });
    }
}
