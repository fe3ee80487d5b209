//! The value types of settings, each parsed from and printed as its human form: addresses,
//! durations, sizes, modes, and the small enums.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A client listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("`unix:` needs a socket path".into());
            }
            Ok(ListenAddr::Unix(PathBuf::from(path)))
        } else {
            let addr = s.strip_prefix("tcp:").unwrap_or(s);
            addr.parse().map(ListenAddr::Tcp).map_err(|_| {
                format!("`{s}` is neither unix:PATH nor tcp:HOST:PORT (an IP address and port)")
            })
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}
string_serde!(ListenAddr);

/// The admin listen address, or `off`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddr {
    Off,
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for AdminAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(AdminAddr::Off);
        }
        Ok(match s.parse::<ListenAddr>()? {
            ListenAddr::Unix(p) => AdminAddr::Unix(p),
            ListenAddr::Tcp(a) => AdminAddr::Tcp(a),
        })
    }
}

impl fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminAddr::Off => f.write_str("off"),
            AdminAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            AdminAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}
string_serde!(AdminAddr);

/// Where llama-server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamAddr {
    /// `host:port` of an `http://` URL.
    Tcp(String),
    Unix(PathBuf),
}

impl FromStr for UpstreamAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("`unix:` needs a socket path".into());
            }
            return Ok(UpstreamAddr::Unix(PathBuf::from(path)));
        }
        let Some(rest) = s.strip_prefix("http://") else {
            return Err(format!(
                "`{s}` must be http://HOST:PORT or unix:PATH (https is not supported)"
            ));
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("`{s}` must be http://HOST:PORT with no path"));
        }
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| format!("`{s}` needs an explicit port"))?;
        // Digits only: `u16` parsing alone takes `+80`, which a URI does not read as a port.
        let digits = port.bytes().all(|b| b.is_ascii_digit());
        if host.is_empty() || !digits || port.parse::<u16>().is_err() {
            return Err(format!("`{s}` needs a host and a numeric port"));
        }
        // The upstream client puts the address into every request's URI, so it must be a URI
        // authority as it stands: `http://a b:1` would send every request nowhere, and in
        // `http://h#x:1` a URI sees host `h` and no port at all.
        match authority.parse::<http::uri::Authority>() {
            Ok(a) if a.as_str() == authority && a.port_u16().is_some() => {}
            _ => return Err(format!("`{s}` is not a valid http://HOST:PORT")),
        }
        Ok(UpstreamAddr::Tcp(authority.to_owned()))
    }
}

impl fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamAddr::Tcp(a) => write!(f, "http://{a}"),
            UpstreamAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}
string_serde!(UpstreamAddr);

/// How many requests are forwarded at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// As many as llama-server has (`total_slots` in `/props`).
    Auto,
    Fixed(usize),
}

impl Slots {
    /// Before llama-server has said: the fixed number, or one (nothing is lost by starting narrow;
    /// `/props` is read as soon as the server is ready).
    pub fn initial(self) -> usize {
        match self {
            Slots::Auto => 1,
            Slots::Fixed(n) => n,
        }
    }
}

impl FromStr for Slots {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Slots::Auto),
            n => n.parse().map(Slots::Fixed).map_err(|_| {
                format!("`{s}` is not a number of slots; use auto or a number such as 4")
            }),
        }
    }
}

impl fmt::Display for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slots::Auto => f.write_str("auto"),
            Slots::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// `slots = 4` or `slots = "auto"`, and printed back the same way.
impl Serialize for Slots {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Slots::Auto => s.serialize_str("auto"),
            Slots::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Slots {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = super::StringOrInt::deserialize(d)?;
        raw.0.parse().map_err(serde::de::Error::custom)
    }
}

/// How llama-server's slots hold their context (see `--kv-pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPool {
    /// Learned from llama-server.
    Auto,
    /// Each slot has a context of its own.
    PerSlot,
    /// One pool of this many tokens, shared by all slots.
    Tokens(u64),
}

impl FromStr for KvPool {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(KvPool::Auto),
            "per-slot" => Ok(KvPool::PerSlot),
            n => n.parse().map(KvPool::Tokens).map_err(|_| {
                format!(
                    "`{s}` is not a KV pool; use auto, per-slot or a number of tokens such as 8192"
                )
            }),
        }
    }
}

impl fmt::Display for KvPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvPool::Auto => f.write_str("auto"),
            KvPool::PerSlot => f.write_str("per-slot"),
            KvPool::Tokens(n) => write!(f, "{n}"),
        }
    }
}

/// `kv-pool = 8192` or `kv-pool = "per-slot"`.
impl Serialize for KvPool {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvPool::Tokens(n) => s.serialize_u64(*n),
            other => s.collect_str(other),
        }
    }
}

impl<'de> Deserialize<'de> for KvPool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = super::StringOrInt::deserialize(d)?;
        raw.0.parse().map_err(serde::de::Error::custom)
    }
}

/// A duration in human units (`500ms`, `60s`, `2m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        humantime::parse_duration(s.trim())
            .map(Dur)
            .map_err(|e| format!("`{s}` is not a duration ({e}); use units such as 500ms, 60s, 2m"))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}
string_serde!(Dur);

/// A size in bytes: a number, or one with a unit: `KiB`, `MiB`, `GiB` (1024-based) or `KB`, `MB`,
/// `GB` (1000-based). A bare `K`, `M`, `G` is refused with both readings: some read `8M` as 8 MiB,
/// others as 8 MB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub usize);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || {
            format!("`{s}` is not a size; use bytes, KiB, MiB, GiB (1024-based) or KB, MB, GB (e.g. 8MiB)")
        };
        let n: usize = num.parse().map_err(|_| bad())?;
        let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            u @ ("k" | "m" | "g") => {
                let u = u.to_ascii_uppercase();
                return Err(format!(
                    "`{s}` is ambiguous: write {num}{u}iB (1024-based) or {num}{u}B (1000-based)"
                ));
            }
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            _ => return Err(bad()),
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match n {
            _ if n >= 1 << 30 && n % (1 << 30) == 0 => write!(f, "{}GiB", n >> 30),
            _ if n >= 1 << 20 && n % (1 << 20) == 0 => write!(f, "{}MiB", n >> 20),
            _ if n >= 1 << 10 && n % (1 << 10) == 0 => write!(f, "{}KiB", n >> 10),
            _ => write!(f, "{n}"),
        }
    }
}
string_serde!(ByteSize);

/// An octal file mode such as `0660`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketMode(pub u32);

impl FromStr for SocketMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let digits = s.trim().trim_start_matches("0o");
        match u32::from_str_radix(digits, 8) {
            Ok(m) if m <= 0o777 => Ok(SocketMode(m)),
            _ => Err(format!("`{s}` is not an octal file mode such as 0660")),
        }
    }
}

impl fmt::Display for SocketMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}
string_serde!(SocketMode);

/// How prompt tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// llama-server's own template and tokenizer, with the estimate as fallback.
    Upstream,
    /// Characters / 4.
    Estimate,
}

impl FromStr for Tokenizer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "upstream" => Ok(Tokenizer::Upstream),
            "estimate" => Ok(Tokenizer::Estimate),
            _ => Err(format!(
                "`{s}` is not a tokenizer; use upstream or estimate"
            )),
        }
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tokenizer::Upstream => "upstream",
            Tokenizer::Estimate => "estimate",
        })
    }
}
string_serde!(Tokenizer);

/// Whether the models behind llama-server's router take turns (one model decoding at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelTurns {
    /// While the loaded children's threads together exceed the CPUs.
    Auto,
    /// Always, with two models or more loaded.
    On,
    /// Never: each model's pool admits on its own slots alone.
    Off,
}

impl FromStr for ModelTurns {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ModelTurns::Auto),
            "on" => Ok(ModelTurns::On),
            "off" => Ok(ModelTurns::Off),
            _ => Err(format!("`{s}` is not a turns setting; use auto, on or off")),
        }
    }
}

impl fmt::Display for ModelTurns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModelTurns::Auto => "auto",
            ModelTurns::On => "on",
            ModelTurns::Off => "off",
        })
    }
}
string_serde!(ModelTurns);

/// A group of llama-server's admin routes (`docs/endpoints.md`) the client listener may forward
/// (`client-admin-routes`), each as llama-server groups them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRoutes {
    /// Every group below.
    All,
    /// `GET /slots` (every slot's prompt and output so far) and `POST /slots/:id` (save, restore,
    /// erase a slot's cache).
    Slots,
    /// `GET /metrics`: llama-server's own series.
    Metrics,
    /// The router's `/models` changes and `/models/sse`: add, load, unload, delete models.
    Models,
    /// `/lora-adapters`: the adapters every request uses.
    LoraAdapters,
    /// `POST /props`: the server's global properties.
    Props,
}

impl AdminRoutes {
    /// Every group, `all` first.
    pub const NAMES: &[(&str, AdminRoutes)] = &[
        ("all", AdminRoutes::All),
        ("slots", AdminRoutes::Slots),
        ("metrics", AdminRoutes::Metrics),
        ("models", AdminRoutes::Models),
        ("lora-adapters", AdminRoutes::LoraAdapters),
        ("props", AdminRoutes::Props),
    ];
}

impl FromStr for AdminRoutes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        AdminRoutes::NAMES
            .iter()
            .find(|(name, _)| *name == s.trim())
            .map(|(_, g)| *g)
            .ok_or_else(|| {
                format!("`{s}` is not a group of admin routes; use all, slots, metrics, models, lora-adapters or props")
            })
    }
}

impl fmt::Display for AdminRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = AdminRoutes::NAMES
            .iter()
            .find(|(_, g)| g == self)
            .map_or("?", |(n, _)| n);
        f.write_str(name)
    }
}
string_serde!(AdminRoutes);

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("`{s}` is not a log format; use text or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}
string_serde!(LogFormat);

/// A secret that `Debug` and logs never show.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// What one request's body may be: its size, and how long it may take to arrive.
pub struct Limits {
    pub max_body: usize,
    pub body_timeout: Duration,
}
