//! The picture `slotgate top` draws: a header (version, uptime, the upstream, rates and a
//! sparkline), in front of llama-server's router a table of its models, then three tables (slots,
//! the queue in service order, tenants) and a line of keys.
//! The same drawing makes the `--once` text, so a script sees what the screen shows.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use ratatui::Frame;

use crate::log::shown::shown as escaped;

use super::model::{model_state, LlamaSlot, ModelPool, Picture, Request, Tenant, Waiter};

/// Which table the sort keys act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Slots,
    Queue,
    Tenants,
}

impl Focus {
    pub fn next(self) -> Focus {
        match self {
            Focus::Slots => Focus::Queue,
            Focus::Queue => Focus::Tenants,
            Focus::Tenants => Focus::Slots,
        }
    }
}

/// What the viewer chose: focus, sort per table, a filter, and what the last refresh said.
#[derive(Debug, Clone)]
pub struct ViewState {
    pub focus: Focus,
    /// Index into each table's sort keys ([`SLOT_SORTS`], [`QUEUE_SORTS`], [`TENANT_SORTS`]).
    pub sort: [usize; 3],
    pub reverse: [bool; 3],
    pub filter: String,
    /// Typing a filter (after `/`).
    pub editing: bool,
    pub paused: bool,
    /// The last refresh failed: why (the picture shown is the one before).
    pub error: Option<String>,
    pub source: String,
    /// `--once`: no key line.
    pub plain: bool,
}

impl ViewState {
    pub fn new(source: String) -> ViewState {
        ViewState {
            focus: Focus::Slots,
            sort: [0; 3],
            reverse: [false; 3],
            filter: String::new(),
            editing: false,
            paused: false,
            error: None,
            source,
            plain: false,
        }
    }

    fn at(&self, focus: Focus) -> usize {
        focus as usize
    }

    /// The focused table's next sort key.
    pub fn next_sort(&mut self) {
        let i = self.at(self.focus);
        let n = [SLOT_SORTS.len(), QUEUE_SORTS.len(), TENANT_SORTS.len()][i];
        self.sort[i] = (self.sort[i] + 1) % n;
    }

    pub fn flip(&mut self) {
        let i = self.at(self.focus);
        self.reverse[i] = !self.reverse[i];
    }

    fn matches(&self, fields: &[&str]) -> bool {
        if self.filter.is_empty() {
            return true;
        }
        let needle = self.filter.to_lowercase();
        fields.iter().any(|f| f.to_lowercase().contains(&needle))
    }
}

pub const SLOT_SORTS: [&str; 4] = ["slot", "age", "tenant", "tokens"];
pub const QUEUE_SORTS: [&str; 4] = ["order", "age", "tenant", "priority"];
pub const TENANT_SORTS: [&str; 4] = ["served", "refused", "waiting", "name"];

/// One row of the slots table: a slot, the request on it (if any) and llama-server's own view of
/// the slot with that number (if it says).
pub struct SlotRow<'a> {
    pub slot: usize,
    pub request: Option<&'a Request>,
    pub llama: Option<&'a LlamaSlot>,
}

/// The slots as rows. slotgate knows which requests hold its slots, llama-server which of its
/// slots runs a task; they are paired by order (llama-server numbers tasks as they arrive, and
/// slotgate forwards in the order it admits) when both count the same number busy, else shown
/// side by side unpaired.
pub fn slot_rows(p: &Picture) -> (Vec<SlotRow<'_>>, bool) {
    let mut serving: Vec<&Request> = p.live.requests.iter().filter(|r| r.in_service()).collect();
    serving.sort_by(|a, b| {
        let (a, b) = (a.in_service_seconds, b.in_service_seconds);
        b.partial_cmp(&a).unwrap_or(std::cmp::Ordering::Equal)
    });
    // Each request holds as many slots as llama-server runs tasks for it.
    let units: Vec<&Request> = serving
        .iter()
        .flat_map(|r| std::iter::repeat_n(*r, r.slots.max(1) as usize))
        .collect();
    let total = p.live.slots.total as usize;
    let llama: Vec<&LlamaSlot> = match &p.llama_slots {
        Ok(s) => {
            let mut s: Vec<&LlamaSlot> = s.iter().collect();
            s.sort_by_key(|s| s.id);
            s
        }
        Err(_) => Vec::new(),
    };
    let mut by_task: Vec<&LlamaSlot> = llama.iter().copied().filter(|s| s.is_processing).collect();
    by_task.sort_by_key(|s| s.id_task.unwrap_or(i64::MAX));
    let paired = !llama.is_empty() && by_task.len() == units.len();
    let rows = total.max(llama.len()).max(units.len());
    let mut out = Vec::with_capacity(rows);
    if paired {
        for slot in 0..rows {
            let l = llama.get(slot).copied();
            let request = l.and_then(|l| {
                by_task
                    .iter()
                    .position(|t| t.id == l.id)
                    .map(|at| units[at])
            });
            out.push(SlotRow {
                slot,
                request,
                llama: l,
            });
        }
    } else {
        for slot in 0..rows {
            out.push(SlotRow {
                slot,
                request: units.get(slot).copied(),
                llama: llama.get(slot).copied(),
            });
        }
    }
    (out, paired || llama.is_empty())
}

/// Seconds as people read them: 850ms, 2.1s, 1m05s, 1h02m.
pub fn dur(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".into();
    }
    if secs < 1.0 {
        format!("{}ms", (secs * 1e3).round() as u64)
    } else if secs < 60.0 {
        format!("{secs:.1}s")
    } else if secs < 3600.0 {
        let s = secs as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = secs as u64 / 60;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

/// A count: 999, 1.2k, 3.4M.
pub fn count(n: f64) -> String {
    if n < 1_000.0 {
        if n.fract() == 0.0 || n >= 100.0 {
            format!("{n:.0}")
        } else {
            format!("{n:.1}")
        }
    } else if n < 1e6 {
        format!("{:.1}k", n / 1e3)
    } else if n < 1e9 {
        format!("{:.1}M", n / 1e6)
    } else {
        format!("{:.1}G", n / 1e9)
    }
}

/// The last `width` values as bars, the tallest the highest seen.
pub fn sparkline(values: &[u64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let shown = &values[values.len().saturating_sub(width)..];
    let max = shown.iter().copied().max().unwrap_or(0);
    shown
        .iter()
        .map(|v| match (max, v) {
            (0, _) => ' ',
            (_, 0) => ' ',
            (m, v) => BARS[((*v * 7) / m) as usize],
        })
        .collect()
}

/// A client's text in a cell: control characters escaped (`log::shown`), cut to `width`.
fn cut(s: &str, width: usize) -> String {
    let s = escaped(s);
    if s.chars().count() <= width {
        return s.into_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

/// How many rows each part gets of `height`: the header, the models table (none when there are no
/// models), the three tables (title and column header each, then rows), the key line.
fn heights(height: u16, want: [usize; 3], models: usize, plain: bool) -> [u16; 6] {
    let keys = u16::from(!plain);
    let models_table = |rows: u16| match models {
        0 => 0,
        _ => 2 + rows,
    };
    if plain {
        let t = want.map(|n| 2 + n.max(1) as u16);
        return [2, models_table(models as u16), t[0], t[1], t[2], 0];
    }
    let room = height.saturating_sub(2 + keys);
    // The models to at most a quarter, then slots and tenants, each to at most a third of the
    // rest; the queue takes what is left.
    let models = models_table((models as u16).min((room / 4).saturating_sub(2).max(1)));
    let tables = room.saturating_sub(models + 6);
    let slots = (want[0].max(1) as u16).min((tables / 3).max(2));
    let tenants = (want[2].max(1) as u16).min((tables / 4).max(2));
    let queue = tables.saturating_sub(slots + tenants);
    [2, models, 2 + slots, 2 + queue, 2 + tenants, keys]
}

/// The rows each table shows once filtered and sorted.
pub struct Rows<'a> {
    pub slots: Vec<SlotRow<'a>>,
    pub paired: bool,
    pub queue: Vec<(usize, &'a Waiter)>,
    pub tenants: Vec<&'a Tenant>,
}

pub fn rows<'a>(p: &'a Picture, v: &ViewState) -> Rows<'a> {
    let (mut slots, paired) = slot_rows(p);
    if !v.filter.is_empty() {
        slots.retain(|r| {
            r.request.is_some_and(|q| {
                v.matches(&[q.tenant.as_deref().unwrap_or(""), &q.request_id, &q.path])
            })
        });
    }
    match SLOT_SORTS[v.sort[0]] {
        "age" => slots.sort_by(|a, b| {
            let age = |r: &SlotRow| r.request.map_or(-1.0, |q| q.age_seconds);
            age(b).total_cmp(&age(a))
        }),
        "tenant" => slots.sort_by_key(|r| r.request.and_then(|q| q.tenant.clone())),
        "tokens" => slots.sort_by_key(|r| {
            std::cmp::Reverse(
                r.request
                    .map_or(0, |q| q.prompt_tokens + q.generated_tokens),
            )
        }),
        _ => {}
    }
    if v.reverse[0] {
        slots.reverse();
    }
    let mut queue: Vec<(usize, &Waiter)> = p
        .live
        .queue
        .waiters
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            v.matches(&[
                &w.tenant,
                w.request_id.as_deref().unwrap_or(""),
                w.path.as_deref().unwrap_or(""),
            ])
        })
        .collect();
    match QUEUE_SORTS[v.sort[1]] {
        "age" => queue.sort_by(|a, b| b.1.age_seconds.total_cmp(&a.1.age_seconds)),
        "tenant" => queue.sort_by(|a, b| a.1.tenant.cmp(&b.1.tenant)),
        "priority" => queue.sort_by_key(|w| w.1.priority),
        _ => {}
    }
    if v.reverse[1] {
        queue.reverse();
    }
    let mut tenants: Vec<&Tenant> = p
        .live
        .tenants
        .iter()
        .filter(|t| v.matches(&[&t.tenant]))
        .collect();
    match TENANT_SORTS[v.sort[2]] {
        "refused" => tenants.sort_by_key(|t| std::cmp::Reverse(t.refused_total())),
        "waiting" => tenants.sort_by_key(|t| std::cmp::Reverse(t.waiting)),
        "name" => tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant)),
        _ => tenants.sort_by_key(|t| std::cmp::Reverse(t.served_tokens)),
    }
    if v.reverse[2] {
        tenants.reverse();
    }
    Rows {
        slots,
        paired,
        queue,
        tenants,
    }
}

/// Rows a plain snapshot needs to show everything.
pub fn plain_height(p: &Picture, v: &ViewState) -> u16 {
    let r = rows(p, v);
    let h = heights(
        0,
        [r.slots.len(), r.queue.len(), r.tenants.len()],
        p.live.models.len(),
        true,
    );
    h.iter().sum()
}

pub fn draw(f: &mut Frame, p: &Picture, v: &ViewState) {
    let r = rows(p, v);
    let h = heights(
        f.area().height,
        [r.slots.len(), r.queue.len(), r.tenants.len()],
        p.live.models.len(),
        v.plain,
    );
    let parts = Layout::vertical(h.map(Constraint::Length)).split(f.area());
    header(f, parts[0], p);
    if !p.live.models.is_empty() {
        models(f, parts[1], &p.live.models, v);
    }
    slots(f, parts[2], p, &r, v);
    queue(f, parts[3], p, &r, v);
    tenants(f, parts[4], p, &r, v);
    if !v.plain {
        keys(f, parts[5], v);
    }
}

fn header(f: &mut Frame, area: Rect, p: &Picture) {
    let l = &p.live;
    let upstream = match (l.upstream.ready, &l.upstream.last_error) {
        (true, _) => "ready".to_owned(),
        (false, Some(e)) => format!("NOT READY: {e}"),
        (false, None) => "not ready".to_owned(),
    };
    let llama = match (&p.llama_slots, l.upstream.total_slots) {
        (Ok(s), _) => format!(" ({} slots)", s.len()),
        (Err(_), Some(n)) => format!(" ({n} slots)"),
        (Err(_), None) => String::new(),
    };
    let first = Line::from(vec![
        Span::styled(format!("slotgate {}", l.version), bold()),
        // The address last: a long socket path is what the edge cuts.
        Span::raw(format!(
            " · up {} · upstream {upstream}{llama} {}",
            dur(l.uptime_seconds),
            l.upstream.target
        )),
    ]);
    let r = &l.rates;
    let wait = |q: Option<f64>| q.map_or("-".into(), dur);
    let figures = format!(
        "{} req/s  {} tok/s  {} 429/s  wait p50 {} p95 {}  ",
        count(r.requests_per_second),
        count(r.tokens_per_second),
        count(r.refused_per_second),
        wait(r.queue_wait_p50_seconds),
        wait(r.queue_wait_p95_seconds),
    );
    let room = (area.width as usize).saturating_sub(figures.chars().count());
    let second = Line::from(vec![
        Span::raw(figures),
        Span::raw(sparkline(&l.history.requests, room)),
    ]);
    f.render_widget(Paragraph::new(vec![first, second]), area);
}

fn title(text: String, focused: bool, v: &ViewState) -> Block<'static> {
    let style = match focused && !v.plain {
        true => bold().add_modifier(Modifier::REVERSED),
        false => bold(),
    };
    Block::new()
        .borders(Borders::TOP)
        .title(Span::styled(text, style))
}

fn sorted(v: &ViewState, focus: Focus, keys: &[&str]) -> String {
    let i = focus as usize;
    match (v.sort[i], v.reverse[i]) {
        (0, false) => String::new(),
        (k, rev) => format!(" · by {}{}", keys[k], if rev { " ↑" } else { "" }),
    }
}

fn shown(rows: usize, room: u16) -> String {
    let room = room.saturating_sub(2) as usize;
    match rows > room {
        true => format!(" · {room} of {rows} shown"),
        false => String::new(),
    }
}

/// In front of llama-server's router: a row per model slotgate keeps a pool for.
fn models(f: &mut Frame, area: Rect, models: &[ModelPool], v: &ViewState) {
    let loaded = models.iter().filter(|m| m.admitting).count();
    let text = format!(
        " Models {loaded}/{} loaded{} ",
        models.len(),
        shown(models.len(), area.height)
    );
    let rows = models.iter().map(|m| {
        Row::new(vec![
            cut(&m.model, 14),
            cut(&model_state(m), 22),
            format!("{}/{}", m.busy, m.slots),
            format!("{}/{}", m.depth, m.capacity),
            dur(m.estimated_wait_seconds),
            m.load.last_seconds.map_or("-".into(), dur),
            m.load.error.clone().unwrap_or_default(),
        ])
    });
    let columns = [
        ("MODEL", 14),
        ("STATE", 22),
        ("SLOTS", 5),
        ("QUEUE", 7),
        ("WAIT", 6),
        ("LOAD", 6),
        ("LAST ERROR", 0),
    ];
    table(f, area, title(text, false, v), &columns, 10, rows);
}

fn slots(f: &mut Frame, area: Rect, p: &Picture, r: &Rows, v: &ViewState) {
    let s = &p.live.slots;
    let kv = match s.kv_pool_tokens {
        Some(pool) => format!(
            " · KV {}/{}",
            count(s.kv_reserved_tokens as f64),
            count(pool as f64)
        ),
        None => String::new(),
    };
    let llama = match &p.llama_slots {
        Ok(_) if !r.paired => " · llama-server's slots unpaired",
        Ok(_) => "",
        Err(_) => " · llama-server's /slots unavailable",
    };
    // Shedding on (or having happened): what holds slots that may yield, and what yielded.
    let shed = match s.sheddable + s.shed_before_first_byte + s.shed_after_first_byte {
        0 => String::new(),
        _ => format!(
            " · sheddable {} · shed {}+{}",
            s.sheddable, s.shed_before_first_byte, s.shed_after_first_byte
        ),
    };
    let text = format!(
        " Slots {}/{} busy{kv}{llama}{shed}{}{} ",
        s.busy,
        s.total,
        sorted(v, Focus::Slots, &SLOT_SORTS),
        shown(r.slots.len(), area.height)
    );
    let rows = r.slots.iter().map(|row| {
        let llama = row.llama.map_or(String::new(), |l| match l.is_processing {
            true => format!("run {}", l.decoded()),
            false => "idle".into(),
        });
        match row.request {
            Some(q) => Row::new(vec![
                row.slot.to_string(),
                cut(&q.request_id, 10),
                cut(q.tenant.as_deref().unwrap_or("-"), 12),
                cut(&q.path, 20),
                count(q.prompt_tokens as f64),
                count(q.generated_tokens as f64),
                dur(q.in_service_seconds.unwrap_or(q.age_seconds)),
                llama,
            ]),
            None => Row::new(vec![
                row.slot.to_string(),
                "idle".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                llama,
            ]),
        }
    });
    let columns = [
        ("SLOT", 4),
        ("REQUEST", 10),
        ("TENANT", 12),
        ("ENDPOINT", 20),
        ("PROMPT", 6),
        ("GEN", 5),
        ("AGE", 6),
        ("LLAMA", 0),
    ];
    table(
        f,
        area,
        title(text, v.focus == Focus::Slots, v),
        &columns,
        6,
        rows,
    );
}

fn queue(f: &mut Frame, area: Rect, p: &Picture, r: &Rows, v: &ViewState) {
    let q = &p.live.queue;
    let state = if q.draining { " · DRAINING" } else { "" };
    // With overload bands: how many of the waiters shown each band holds (`background 4`).
    let mut bands: Vec<(&str, usize)> = Vec::new();
    for w in &q.waiters {
        if let Some(b) = w.band.as_deref() {
            match bands.iter_mut().find(|(n, _)| *n == b) {
                Some((_, n)) => *n += 1,
                None => bands.push((b, 1)),
            }
        }
    }
    let bands: String = bands.iter().map(|(b, n)| format!(" · {b} {n}")).collect();
    let text = format!(
        " Queue {}/{}{bands} · est. wait {}{state}{}{} ",
        q.depth,
        q.capacity,
        dur(q.estimated_wait_seconds),
        sorted(v, Focus::Queue, &QUEUE_SORTS),
        shown(r.queue.len(), area.height)
    );
    let rows = r.queue.iter().map(|(at, w)| {
        let pri = match w.effective_priority == w.priority {
            true => w.priority.to_string(),
            false => format!("{}>{}", w.priority, w.effective_priority),
        };
        Row::new(vec![
            (at + 1).to_string(),
            cut(w.request_id.as_deref().unwrap_or("-"), 10),
            pri,
            cut(&w.tenant, 12),
            cut(w.path.as_deref().unwrap_or("-"), 20),
            dur(w.age_seconds),
            count(w.reserved_tokens as f64),
            match w.deadline_in_seconds {
                // Its own deadline after the start: `3.0s ≤4.5s` (fits the column at 80 wide).
                Some(due) => format!("{} ≤{}", dur(w.expected_start_seconds), dur(due)),
                None => format!("in {}", dur(w.expected_start_seconds)),
            },
        ])
    });
    let columns = [
        ("#", 3),
        ("REQUEST", 10),
        ("PRI", 5),
        ("TENANT", 12),
        ("ENDPOINT", 20),
        ("AGE", 6),
        ("RESERV", 6),
        ("START", 0),
    ];
    table(
        f,
        area,
        title(text, v.focus == Focus::Queue, v),
        &columns,
        8,
        rows,
    );
}

fn tenants(f: &mut Frame, area: Rect, p: &Picture, r: &Rows, v: &ViewState) {
    let text = format!(
        " Tenants {}{}{} ",
        p.live.tenants.len(),
        sorted(v, Focus::Tenants, &TENANT_SORTS),
        shown(r.tenants.len(), area.height)
    );
    let rows = r.tenants.iter().map(|t| {
        let top = t
            .refused
            .iter()
            .max_by_key(|(_, n)| **n)
            .map_or(String::new(), |(why, n)| format!("{why} {n}"));
        Row::new(vec![
            cut(&t.tenant, 14),
            count(t.served_tokens as f64),
            format!("{:.0}%", t.share * 100.0),
            t.virtual_tokens
                .map_or("-".into(), |c| count(c.max(0.0).round())),
            t.in_service.to_string(),
            t.waiting.to_string(),
            t.refused_total().to_string(),
            p.live
                .budget_of(&t.tenant)
                .map_or("-".into(), |b| match b.limit {
                    Some(l) => format!("{}/{}", count(b.left.max(0.0).floor()), count(l)),
                    None => count(b.left.max(0.0).floor()),
                }),
            top,
        ])
    });
    let columns = [
        ("TENANT", 14),
        ("SERVED", 7),
        ("SHARE", 5),
        ("VTC", 7),
        ("RUN", 4),
        ("WAIT", 4),
        ("REFUSED", 7),
        ("BUDGET LEFT", 11),
        ("MOST REFUSED FOR", 0),
    ];
    table(
        f,
        area,
        title(text, v.focus == Focus::Tenants, v),
        &columns,
        10,
        rows,
    );
}

/// A table under its title: columns of the widths given (0: the rest, at least `last_min`), its
/// header in bold.
fn table<'a>(
    f: &mut Frame,
    area: Rect,
    block: Block<'a>,
    columns: &[(&'static str, u16)],
    last_min: u16,
    rows: impl IntoIterator<Item = Row<'a>>,
) {
    let widths = columns.iter().map(|(_, w)| match w {
        0 => Constraint::Min(last_min),
        w => Constraint::Length(*w),
    });
    let header = Row::new(columns.iter().map(|(h, _)| *h)).style(bold());
    f.render_widget(Table::new(rows, widths).header(header).block(block), area);
}

fn keys(f: &mut Frame, area: Rect, v: &ViewState) {
    let line = if v.editing {
        format!("filter: {}▏ (enter to keep, esc to clear)", v.filter)
    } else if let Some(e) = &v.error {
        format!("cannot refresh: {e}")
    } else {
        let filter = match v.filter.is_empty() {
            true => String::new(),
            false => format!(" · filter \"{}\"", v.filter),
        };
        let paused = if v.paused { " · PAUSED" } else { "" };
        format!(
            "q quit · tab focus · s sort · r reverse · / filter · p pause{filter}{paused} · {}",
            v.source
        )
    };
    f.render_widget(
        Paragraph::new(Line::from(Span::styled(
            line,
            Style::default().add_modifier(Modifier::REVERSED),
        ))),
        area,
    );
}
