//! The commands' way into a running slotgate: one HTTP/1 call to its admin listener (TCP or a
//! Unix socket), with the admin token (or the read-only one) from the file slotgate reads it from.
//! Used by `top`, `quota` and `usage`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::config::AdminAddr;

/// Where the admin listener is and the token to show it, as every admin command takes them.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// The admin listener: `HOST:PORT`, `tcp:HOST:PORT` or `unix:PATH` (slotgate's
    /// `--admin-listen`).
    #[arg(
        long,
        env = "SLOTGATE_ADMIN_LISTEN",
        value_name = "ADDR",
        default_value = "tcp:127.0.0.1:9464"
    )]
    pub admin: AdminAddr,
    /// A file holding the admin token (or, for reading, the read-only one), when slotgate runs
    /// with --admin-token-file: sent as `Authorization: Bearer`. The same file and variable as
    /// slotgate's.
    #[arg(long, env = "SLOTGATE_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,
}

/// A resolved admin listener and its credentials.
pub struct Target {
    at: At,
    pub bearer: Option<http::HeaderValue>,
}

enum At {
    Tcp(String),
    Unix(PathBuf),
}

impl Target {
    /// From the command's arguments; an error names what is wrong (exit 2).
    pub fn new(args: &AdminArgs) -> Result<Target, String> {
        let at = match &args.admin {
            AdminAddr::Off => {
                return Err("--admin off: nothing to call (give the --admin-listen address)".into())
            }
            AdminAddr::Tcp(a) => At::Tcp(a.to_string()),
            AdminAddr::Unix(p) => At::Unix(p.clone()),
        };
        let bearer = args
            .admin_token_file
            .as_deref()
            .map(token_header)
            .transpose()
            .map_err(|e| format!("--admin-token-file: {e}"))?;
        Ok(Target { at, bearer })
    }

    /// One call within `timeout`: the status and the body.
    pub async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(u16, Bytes), String> {
        tokio::time::timeout(timeout, async {
            match &self.at {
                At::Tcp(addr) => {
                    let s = tokio::net::TcpStream::connect(addr)
                        .await
                        .map_err(|e| format!("{addr}: {e}"))?;
                    self.exchange(s, method, path, body).await
                }
                At::Unix(p) => {
                    let s = tokio::net::UnixStream::connect(p)
                        .await
                        .map_err(|e| format!("{}: {e}", p.display()))?;
                    self.exchange(s, method, path, body).await
                }
            }
        })
        .await
        .map_err(|_| format!("no answer to {path} within {timeout:?}"))?
    }

    async fn exchange<S>(
        &self,
        stream: S,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "slotgate");
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let mut req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| e.to_string())?;
        if let Some(b) = &self.bearer {
            req.headers_mut()
                .insert(http::header::AUTHORIZATION, b.clone());
        }
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
}

/// `Bearer <token>` from a token file, read as slotgate reads its own.
fn token_header(path: &Path) -> Result<http::HeaderValue, String> {
    let token = crate::config::token_from_file(path)?;
    let mut value = http::HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| format!("the token in {} cannot be sent", path.display()))?;
    value.set_sensitive(true);
    Ok(value)
}
