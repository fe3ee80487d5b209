//! `slotgate top`: a live view of one slotgate, read from its admin listener about once a second
//! (`GET /live`, and llama-server's `GET /slots` forwarded there). `--once` prints the same picture
//! as plain text and exits, for scripts and bug reports.

mod model;
mod view;

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{execute, terminal};

use super::admin_client::{AdminArgs, Target};
use model::{Live, LlamaSlot, Picture};
use view::ViewState;

#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Time between refreshes (e.g. `1s`, `500ms`).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print one plain-text snapshot and exit: 0 when it could be read, 1 when not.
    #[arg(long)]
    pub once: bool,
    /// Width of the `--once` text (default: the terminal's, else 80).
    #[arg(long, value_name = "COLUMNS")]
    pub width: Option<u16>,
    /// Show only requests, waiters and tenants whose tenant, request id or path contains TEXT
    /// (case-insensitive); `/` changes it while running.
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
}

/// How long one refresh may take before it counts as failed.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

pub fn run(args: TopArgs) -> std::process::ExitCode {
    let target = match Target::new(&args.admin) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("slotgate top: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("slotgate top: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut state = ViewState::new(args.admin.admin.to_string());
    state.filter = args.filter.clone().unwrap_or_default();
    if args.once {
        return match runtime.block_on(picture(&target)) {
            Ok(p) => {
                let width = args
                    .width
                    .or_else(|| terminal::size().ok().map(|s| s.0))
                    .unwrap_or(80);
                print!("{}", text(&p, &mut state, width));
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("slotgate top: cannot read {}: {e}", args.admin.admin);
                std::process::ExitCode::FAILURE
            }
        };
    }
    match interactive(&runtime, &target, &args, state) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("slotgate top: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The picture as plain text, `width` columns, as tall as it needs (nothing cut off).
pub fn text(p: &Picture, state: &mut ViewState, width: u16) -> String {
    state.plain = true;
    let height = view::plain_height(p, state);
    let backend = ratatui::backend::TestBackend::new(width.max(40), height);
    let mut term = match ratatui::Terminal::new(backend) {
        Ok(t) => t,
        Err(e) => return format!("{e}\n"),
    };
    if let Err(e) = term.draw(|f| view::draw(f, p, state)) {
        return format!("{e}\n");
    }
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let mut line = String::new();
        for x in 0..buf.area.width {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Puts the terminal back however the view ends (an error, a panic).
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        if let Err(e) = execute!(std::io::stdout(), terminal::EnterAlternateScreen) {
            let _ = terminal::disable_raw_mode();
            return Err(e);
        }
        Ok(Screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen);
        let _ = terminal::disable_raw_mode();
        let _ = std::io::stdout().flush();
    }
}

fn interactive(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    args: &TopArgs,
    mut state: ViewState,
) -> anyhow::Result<()> {
    let _screen = Screen::enter()?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut term = ratatui::Terminal::new(backend)?;
    term.clear()?;
    let mut current: Option<Picture> = None;
    let mut due = Instant::now();
    loop {
        if Instant::now() >= due {
            due = Instant::now() + args.interval;
            if !state.paused {
                match runtime.block_on(picture(target)) {
                    Ok(p) => {
                        current = Some(p);
                        state.error = None;
                    }
                    Err(e) => state.error = Some(format!("{}: {e}", args.admin.admin)),
                }
            }
        }
        let empty = Picture {
            live: Live::default(),
            llama_slots: Err("not read yet".into()),
        };
        let shown = current.as_ref().unwrap_or(&empty);
        term.draw(|f| view::draw(f, shown, &state))?;
        let wait = due.saturating_duration_since(Instant::now());
        if !event::poll(wait)? {
            continue;
        }
        let Event::Key(key) = event::read()? else {
            // A resize: drawn again at once.
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        if state.editing {
            match key.code {
                KeyCode::Enter => state.editing = false,
                KeyCode::Esc => {
                    state.editing = false;
                    state.filter.clear();
                }
                KeyCode::Backspace => {
                    state.filter.pop();
                }
                KeyCode::Char(c) => state.filter.push(c),
                _ => {}
            }
            continue;
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
            KeyCode::Tab => state.focus = state.focus.next(),
            KeyCode::Char('s') => state.next_sort(),
            KeyCode::Char('r') => state.flip(),
            KeyCode::Char('/') => {
                state.editing = true;
                state.filter.clear();
            }
            KeyCode::Char('p') => state.paused = !state.paused,
            _ => {}
        }
    }
}

/// Where the admin listener is, and the token to show it.
/// One refresh: `/live`, then llama-server's `/slots` (which may be missing).
async fn picture(target: &Target) -> Result<Picture, String> {
    let (status, body) = get(target, "/live").await?;
    match status {
        200 => {}
        401 if target.bearer.is_none() => {
            return Err(
                "GET /live answered 401: this slotgate wants its admin token; give top \
                 --admin-token-file PATH (or SLOTGATE_ADMIN_TOKEN_FILE)"
                    .into(),
            )
        }
        401 => {
            return Err("GET /live answered 401: slotgate refuses the token of \
                 --admin-token-file; give top the file slotgate reads"
                .into())
        }
        403 => {
            let why = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_default();
            return Err(format!("GET /live answered 403: {why}"));
        }
        _ => {
            return Err(format!(
                "GET /live answered {status} (a slotgate older than `top`?)"
            ))
        }
    }
    let live: Live = serde_json::from_slice(&body)
        .map_err(|e| format!("GET /live is not what top reads: {e}"))?;
    let llama_slots = match get(target, "/slots").await {
        Ok((200, body)) => serde_json::from_slice::<Vec<LlamaSlot>>(&body)
            .map_err(|e| format!("llama-server's /slots: {e}")),
        Ok((401, _)) if target.bearer.is_none() => Err(
            "llama-server's /slots answered 401: it wants a key, which slotgate lends only to \
             callers with its admin token (--admin-token-file)"
                .into(),
        ),
        Ok((status, _)) => Err(format!("llama-server's /slots answered {status}")),
        Err(e) => Err(e),
    };
    Ok(Picture { live, llama_slots })
}

async fn get(target: &Target, path: &str) -> Result<(u16, Bytes), String> {
    target
        .call(http::Method::GET, path, None, FETCH_TIMEOUT)
        .await
}

#[cfg(test)]
mod tests;
