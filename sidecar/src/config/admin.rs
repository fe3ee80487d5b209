//! The admin plane's settings, checked: the admin tokens (read from their files and kept only as
//! digests, never printed), the Unix admin socket's mode and uid allow-list, and where audit lines
//! go. What the admin listener does with them is `admin::auth`; docs/security.md says it for
//! operators.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::table::{Keys, Mode, Plain, UidList};
use super::{invalid, ConfigError, Settings};

/// The shortest token taken: anything shorter is guessed too easily over a socket that answers fast.
pub const MIN_TOKEN_LEN: usize = 16;

/// The admin listener's protection, as configured.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub token_file: Option<PathBuf>,
    pub read_token_file: Option<PathBuf>,
    /// What the files held when the configuration was read (re-read on every reload).
    pub tokens: AdminTokens,
    /// `/metrics` is served without a token.
    pub open_metrics: bool,
    /// The file mode of a Unix admin socket slotgate binds.
    pub socket_mode: u32,
    /// On a Unix admin socket: the uids allowed besides slotgate's own; empty: any the mode lets in.
    pub allow_uids: Vec<u32>,
    pub audit_log: AuditLog,
}

/// The SHA-256 of a token: all that is kept of it, so a dump of the process holds no usable secret
/// and a comparison takes the same time whatever the caller sent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(***)")
    }
}

impl TokenDigest {
    pub fn of(token: &[u8]) -> TokenDigest {
        use sha2::{Digest, Sha256};
        TokenDigest(Sha256::digest(token).into())
    }

    /// Equal digests, compared in constant time: every byte is looked at, whatever differs first.
    pub fn matches(&self, other: &TokenDigest) -> bool {
        let diff = self
            .0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// The tokens in force: the full one (every admin route) and the read-only one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdminTokens {
    pub full: Option<TokenDigest>,
    pub read: Option<TokenDigest>,
}

/// What a presented token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// No token matched.
    Nothing,
    /// The read-only token: GET routes only.
    Read,
    /// The admin token: every route.
    Full,
}

impl AdminTokens {
    /// Whether the admin listener wants a token at all.
    pub fn required(&self) -> bool {
        self.full.is_some()
    }

    /// What `presented` grants. Both digests are compared every time, so the answer's timing says
    /// nothing about which token came close.
    pub fn grant(&self, presented: &[u8]) -> Grant {
        let digest = TokenDigest::of(presented);
        let full = self.full.is_some_and(|t| t.matches(&digest));
        let read = self.read.is_some_and(|t| t.matches(&digest));
        match (full, read) {
            (true, _) => Grant::Full,
            (false, true) => Grant::Read,
            _ => Grant::Nothing,
        }
    }
}

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditLog {
    /// With the log on stderr, under the target `slotgate::audit`.
    Stderr,
    /// Appended to this file, one JSON object a line.
    File(PathBuf),
}

impl FromStr for AuditLog {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" => Err("give `stderr` or a file path".into()),
            "stderr" => Ok(AuditLog::Stderr),
            path => Ok(AuditLog::File(PathBuf::from(path))),
        }
    }
}

impl fmt::Display for AuditLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuditLog::Stderr => f.write_str("stderr"),
            AuditLog::File(p) => write!(f, "{}", p.display()),
        }
    }
}
string_serde!(AuditLog);

/// A comma-separated list of uids (`--admin-allow-uids 1000,1001`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uids(pub Vec<u32>);

impl FromStr for Uids {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                u.parse::<u32>()
                    .map_err(|_| format!("`{u}` is not a numeric uid"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Uids)
    }
}

impl fmt::Display for Uids {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&list.join(","))
    }
}

/// A TOML list (`[1000, 1001]`), as the file prints it; or the flag's form, a string or one uid.
impl serde::Serialize for Uids {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Uids {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            List(Vec<u32>),
            One(u32),
            Text(String),
        }
        match <Raw as serde::Deserialize>::deserialize(d)? {
            Raw::List(l) => Ok(Uids(l)),
            Raw::One(u) => Ok(Uids(vec![u])),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

key_table! {
    AdminConfig from Settings {
        admin_token_file => token_file: Plain;
        admin_read_token_file => read_token_file: Plain;
        admin_open_metrics => open_metrics: Plain = false;
        admin_socket_mode => socket_mode: Mode = 0o600;
        admin_allow_uids => allow_uids: UidList = Vec::new();
        audit_log: Plain = AuditLog::Stderr;
    }
    groups {
        tokens: AdminTokens [];
    }
}

/// The tokens the files hold, checked; the files are printed, never a token.
impl Keys<Settings> for AdminTokens {
    type Value = AdminTokens;
    fn read(s: &Settings) -> Result<AdminTokens, ConfigError> {
        let full = s
            .admin_token_file
            .as_deref()
            .map(|p| read_token("admin-token-file", p))
            .transpose()?;
        let read = s
            .admin_read_token_file
            .as_deref()
            .map(|p| read_token("admin-read-token-file", p))
            .transpose()?;
        if read.is_some() && full.is_none() {
            return Err(invalid(
                "admin-read-token-file",
                "a read-only token needs the admin token beside it (admin-token-file): without it, \
                 every admin route would be open to anyone",
            ));
        }
        if full.is_some() && full == read {
            return Err(invalid(
                "admin-read-token-file",
                "holds the same token as admin-token-file: a read-only token must differ",
            ));
        }
        Ok(AdminTokens { full, read })
    }
    fn write(_: &AdminTokens, _: &mut Settings) {}
}

impl AdminConfig {
    /// A uid list wants a Unix admin socket (`listen`; `default`: no layer set it).
    pub(super) fn check_listener(
        &self,
        listen: &super::AdminAddr,
        default: bool,
    ) -> Result<(), ConfigError> {
        if self.allow_uids.is_empty() {
            return Ok(());
        }
        if let super::AdminAddr::Unix(_) | super::AdminAddr::Off = listen {
            return Ok(());
        }
        let at = match default {
            true => format!("{listen} (the default)"),
            false => listen.to_string(),
        };
        Err(invalid(
            "admin-allow-uids",
            format!(
                "the admin listener is {at}, and a TCP peer has no uid: use a unix: admin socket, \
                 or the admin token"
            ),
        ))
    }
}

/// A token file's token: its first line that is not a `#` comment, white space around it dropped
/// (so the newline an editor or `echo` leaves is not part of it). The error names the file, never
/// what it holds. Clients of the admin listener (`slotgate top`) read their token the same way.
pub fn token_from_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or_else(|| {
            format!(
                "{} holds no token (its first line that is not a # comment)",
                path.display()
            )
        })?;
    if http::HeaderValue::try_from(format!("Bearer {token}")).is_err() {
        return Err(format!(
            "the token in {} holds bytes an HTTP header cannot carry",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

fn read_token(key: &'static str, path: &Path) -> Result<TokenDigest, ConfigError> {
    let token = token_from_file(path).map_err(|e| invalid(key, e))?;
    let chars = token.chars().count();
    if chars < MIN_TOKEN_LEN {
        return Err(invalid(
            key,
            format!(
                "the token in {} has {chars} characters; use at least {MIN_TOKEN_LEN} (e.g. \
                 `openssl rand -hex 32`)",
                path.display()
            ),
        ));
    }
    Ok(TokenDigest::of(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "slotgate-admin-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_token_is_its_first_line_without_the_newline() {
        let t = read_token(
            "k",
            &file("# comment\n  s3cret-admin-token-0001 \n\nnext\n"),
        )
        .unwrap();
        assert_eq!(t, TokenDigest::of(b"s3cret-admin-token-0001"));
        let crlf = read_token("k", &file("s3cret-admin-token-0001\r\n")).unwrap();
        assert_eq!(crlf, t);
    }

    #[test]
    fn an_empty_short_or_unreadable_file_is_refused_with_its_reason() {
        let err = |p: &Path| read_token("admin-token-file", p).unwrap_err().to_string();
        assert!(err(&file("")).contains("holds no token"));
        assert!(err(&file("# only a comment\n\n")).contains("holds no token"));
        assert!(err(&file("short\n")).contains("has 5 characters"));
        assert!(err(Path::new("/nonexistent/token")).contains("cannot read"));
        // The message names the file, never its content.
        assert!(!err(&file("short\n")).contains("short\n"));
    }

    #[test]
    fn grants_follow_the_token_presented() {
        let tokens = AdminTokens {
            full: Some(TokenDigest::of(b"full-token-0123456789")),
            read: Some(TokenDigest::of(b"read-token-0123456789")),
        };
        assert_eq!(tokens.grant(b"full-token-0123456789"), Grant::Full);
        assert_eq!(tokens.grant(b"read-token-0123456789"), Grant::Read);
        assert_eq!(tokens.grant(b"full-token-0123456789\n"), Grant::Nothing);
        assert_eq!(tokens.grant(b""), Grant::Nothing);
        assert!(!AdminTokens::default().required());
        assert_eq!(format!("{tokens:?}").matches("***").count(), 2);
    }

    #[test]
    fn a_uid_list_needs_a_unix_admin_socket() {
        let with = |toml_text: &str| {
            let s: Settings = toml::from_str(toml_text).unwrap();
            crate::config::Config::from_settings(s).map(|c| c.admin.allow_uids)
        };
        let err = with("admin-allow-uids = [1000]").unwrap_err().to_string();
        assert!(err.contains("(the default)"), "{err}");
        assert!(with("admin-allow-uids = [1000]\nadmin-listen = \"tcp:127.0.0.1:1\"").is_err());
        let ok = with("admin-allow-uids = [1000, 1001]\nadmin-listen = \"unix:/run/a.sock\"");
        assert_eq!(ok.unwrap(), [1000, 1001]);
    }

    #[test]
    fn uid_lists_parse_and_print() {
        assert_eq!("1000, 1001".parse::<Uids>().unwrap().0, [1000, 1001]);
        assert!("bob".parse::<Uids>().is_err());
        assert_eq!(Uids(vec![1, 2]).to_string(), "1,2");
        #[derive(serde::Deserialize)]
        struct T {
            u: Uids,
        }
        let t: T = toml::from_str("u = [1000, 1001]").unwrap();
        assert_eq!(t.u.0, [1000, 1001]);
        let t: T = toml::from_str("u = \"7,8\"").unwrap();
        assert_eq!(t.u.0, [7, 8]);
    }
}
