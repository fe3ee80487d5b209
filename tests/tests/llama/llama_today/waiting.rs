//! A streaming request waiting for the real llama-server's one slot, behind a real nginx whose
//! `proxy_read_timeout` is shorter than the wait (docs/scheduling.md#waiting-streams): without
//! keep-alive nginx cuts it (its 504) while it waits; kept alive (`X-Slotgate-Keepalive-Ms`) it
//! is told its place, then served whole.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use slotgate_tests::gate::free_port;
use slotgate_tests::llama::{chat, LlamaServer, PROMPT};
use slotgate_tests::*;

use super::{assert_both_idle, gate_before, learned, serial};

/// nginx on 127.0.0.1:`port` in front of `upstream` (`host:port`), with a 1 s read timeout;
/// stopped on drop.
struct Nginx {
    child: Child,
    port: u16,
    _dir: PathBuf,
}

impl Nginx {
    fn start(upstream: &str) -> Nginx {
        let nginx = which("nginx").expect(
            "nginx is missing: apt-get install nginx (scripts/test.sh installs it on a fresh machine)",
        );
        let dir = unique_dir("nginx");
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let port = free_port();
        let conf = format!(
            "worker_processes 1;\nerror_log {dir}/logs/error.log;\npid {dir}/nginx.pid;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
               server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
                 proxy_pass http://{upstream};\n      proxy_http_version 1.1;\n\
                 proxy_read_timeout 1s;\n    }}\n  }}\n}}\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx");
        Nginx {
            child,
            port,
            _dir: dir,
        }
    }

    fn client(&self) -> Client {
        Client::tcp(([127, 0, 0, 1], self.port).into())
    }

    async fn ready(&self) {
        eventually(Duration::from_secs(10), "nginx listening", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn behind_nginx_a_waiting_stream_is_cut_unless_kept_alive() {
    let _one = serial().await;
    let llama = LlamaServer::start(1).await;
    let (gate, base) = gate_before(&llama, Gate::one_slot(4).queue_timeout("60s")).await;
    learned(&gate).await;
    let nginx = Nginx::start(base.trim_start_matches("http://"));
    nginx.ready().await;
    // Each waiter waits behind about three seconds of generation: three of nginx's timeouts.
    let long = llama.tokens_for(Duration::from_secs(3), (50, 1800)).await;
    let short = chat(PROMPT, 8, true);

    for kept_alive in [false, true] {
        let held = gate
            .hold_slot(&Req::from_json(chat(PROMPT, long, false)))
            .await;
        let mut headers = vec![];
        if kept_alive {
            headers.push(("x-slotgate-keepalive-ms", "300"));
        }
        let s = nginx
            .client()
            .stream_with_headers("/v1/chat/completions", &short, &headers)
            .await;
        match kept_alive {
            false => {
                // nginx gave up on a silent upstream: its own 504, the stream never served.
                assert_eq!(s.status, 504, "{:?}", s.headers);
                let _ = s.read_all(Duration::from_secs(5)).await;
            }
            true => {
                assert_eq!(s.status, 200, "{:?}", s.headers);
                let read = s.read_sse(Duration::from_secs(30)).await;
                assert!(read.complete(), "{read:?}");
                assert!(
                    read.raw.contains(": slotgate queued position=1"),
                    "{}",
                    read.raw
                );
                let last: serde_json::Value =
                    serde_json::from_str(read.data.last().unwrap()).unwrap();
                assert_eq!(last["usage"]["completion_tokens"], 8, "{last}");
            }
        }
        let (held, _) = held.await.unwrap();
        assert_eq!(held.status, 200, "{}", held.body);
        // The cut one: its client (nginx) left, so it left the queue unserved.
        assert_both_idle(&gate, &llama).await;
    }
    gate.wait_outcome("client_gone", 1).await;
}
