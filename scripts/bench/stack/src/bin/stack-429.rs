//! stack-429: a bare hyper server that refuses every request with one prepared 429, the stack's
//! limit for slotgate's fast 429. The body and `Retry-After` are those of slotgate's `queue_full`
//! (and of nginx `return 429` in scripts/bench/proxy.conf.in), so all three send about as much.
//!
//!   stack-429 --listen tcp:127.0.0.1:8082 [--shape per-core]
//!
//! The request body is not read: hyper discards what is left of it before the next request.

use std::future::{ready, Ready};
use std::process::ExitCode;

use bytes::Bytes;
use clap::Parser;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use slotgate_bench_stack::{serve_local, serve_multi, Common, Shape};

const BODY: &[u8] =
    br#"{"error":{"message":"the queue is full","type":"rate_limit_error","code":"queue_full"}}"#;

fn refuse(_req: Request<Incoming>) -> Ready<Response<Full<Bytes>>> {
    let mut res = Response::new(Full::new(Bytes::from_static(BODY)));
    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    ready(res)
}

fn main() -> ExitCode {
    let common = Common::parse();
    let served = match common.shape {
        Shape::Multi => serve_multi(&common, refuse),
        Shape::Current | Shape::PerCore => serve_local(&common, || refuse),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stack-429: {e}");
            ExitCode::FAILURE
        }
    }
}
