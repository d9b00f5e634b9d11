//! Drawing the live view from its state: header, table, stack pane, key line, help.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row as TableRow, Table, TableState},
    Frame,
};

use super::state::{Column, Grouping, KindFilter, Row, ViewState, Window};
use crate::model::{report::Kind, report::Report, LiveSnapshot};
use crate::present::{
    human_ns,
    text::{nonzero_lost, traced},
};

const WARNING: Style = Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD);
const DIM: Style = Style::new().fg(Color::DarkGray);

pub fn draw(frame: &mut Frame, state: &ViewState) {
    let pane_height = if state.stack_pane {
        Constraint::Percentage(50)
    } else {
        Constraint::Length(0)
    };
    let [header, table, pane, keys] = Layout::vertical([
        Constraint::Length(6),
        Constraint::Min(3),
        pane_height,
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header_lines(state)), header);
    let rows = state.rows();
    draw_table(frame, table, state, &rows);
    if state.stack_pane {
        draw_stack_pane(frame, pane, rows.get(state.selected()));
    }
    frame.render_widget(Paragraph::new(key_line()).style(DIM), keys);
    if state.help {
        draw_help(frame);
    }
}

fn header_lines(state: &ViewState) -> Vec<Line<'static>> {
    let Some(s) = state.snapshot() else {
        return vec![Line::from(
            "mmapsem-trace: attached; the first numbers come after one interval",
        )];
    };
    let mut first = vec![Span::styled(
        format!("mmapsem-trace  {}", traced(&s.cumulative)),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    first.push(Span::raw(format!(
        "  threads {}  elapsed {}  refresh {}",
        s.threads_now,
        human_ns(s.elapsed_ns),
        human_ns(state.interval.as_nanos() as u64)
    )));
    if state.paused {
        first.push(Span::styled("  PAUSED", WARNING));
    }
    vec![
        Line::from(first),
        Line::from(rates_line(s)),
        Line::from(worst_line(&s.interval)),
        lost_line(&s.cumulative),
        self_cost_line(&s.interval),
        Line::from(view_line(state, s)).style(DIM),
    ]
}

fn rates_line(s: &LiveSnapshot) -> String {
    let secs = (s.interval.duration_ns as f64 / 1e9).max(1e-9);
    let t = &s.interval.totals;
    format!(
        "acquisitions/s  read {:.0}  write {:.0}    waiting: {:.1}% of thread time this interval, \
         {:.1}% {}",
        t.read.acquisitions as f64 / secs,
        t.write.acquisitions as f64 / secs,
        s.interval.wait_share * 100.0,
        s.cumulative.wait_share * 100.0,
        since_label(s)
    )
}

/// The cumulative window starts at the trace start or at the last reset.
fn since_label(s: &LiveSnapshot) -> &'static str {
    if s.was_reset {
        "since reset"
    } else {
        "since start"
    }
}

/// Worst wait and hold of the interval, from its entries; `≤` marks an upper bound (the
/// interval did not beat the earlier record, so only its histogram slot is known).
fn worst_line(interval: &Report) -> String {
    let worst = |kind: Kind| {
        interval
            .entries
            .iter()
            .filter(|e| e.kind == kind)
            .max_by_key(|e| e.max_ns)
            .map_or("-".to_string(), |e| {
                format!(
                    "{} ({})",
                    max_text(e.max_ns, e.max_is_upper_bound),
                    e.mode.label()
                )
            })
    };
    format!(
        "worst this interval  wait {}  hold {}",
        worst(Kind::Wait),
        worst(Kind::Hold)
    )
}

fn max_text(ns: u64, upper_bound: bool) -> String {
    if upper_bound {
        format!("≤{}", human_ns(ns))
    } else {
        human_ns(ns)
    }
}

fn lost_line(report: &Report) -> Line<'static> {
    let nonzero = nonzero_lost(report);
    if nonzero.is_empty() {
        Line::from("lost events: none").style(DIM)
    } else {
        Line::from(format!("lost events: {}", nonzero.join(" "))).style(WARNING)
    }
}

/// The programs' cost over the last interval (an estimate: see the text report's footer).
fn self_cost_line(interval: &Report) -> Line<'static> {
    let cost = &interval.self_cost;
    let (Some(rate), Some(added_ns), Some(per_event)) =
        (cost.events_per_second, cost.added_ns, cost.ns_per_event())
    else {
        let why = cost.reason.as_deref().unwrap_or_default();
        return Line::from(format!("self-cost: unavailable ({why})")).style(DIM);
    };
    let share = cost.added_share.map_or(String::new(), |share| {
        format!(", {:.2}% of thread time", share * 100.0)
    });
    Line::from(format!(
        "self-cost this interval  {rate:.0} events/s  {per_event} ns/event  {} of BPF run \
         time{share}",
        human_ns(added_ns)
    ))
}

fn view_line(state: &ViewState, s: &LiveSnapshot) -> String {
    let grouping = match state.grouping {
        Grouping::Stack => "by stack",
        Grouping::Cause => "by cause",
    };
    let kinds = match state.kinds {
        KindFilter::Both => "waits+holds",
        KindFilter::Wait => "waits",
        KindFilter::Hold => "holds",
    };
    let window = match state.window {
        Window::Cumulative => format!(
            "{} ({})",
            since_label(s),
            human_ns(s.cumulative.duration_ns)
        ),
        Window::Interval => format!("last interval ({})", human_ns(s.interval.duration_ns)),
    };
    let threads = if s.per_thread { ", per thread" } else { "" };
    format!(
        "table: {grouping}, {kinds}{threads}, {window}, sorted by {} {}",
        state.sort.title(),
        if state.descending { "▼" } else { "▲" }
    )
}

fn draw_table(frame: &mut Frame, area: Rect, state: &ViewState, rows: &[Row]) {
    let per_thread = state.snapshot().is_some_and(|s| s.per_thread);
    let mut titles: Vec<Cell> = Column::ALL
        .iter()
        .map(|&c| {
            let mark = if c == state.sort {
                if state.descending {
                    "▼"
                } else {
                    "▲"
                }
            } else {
                ""
            };
            Cell::from(format!("{}{mark}", c.title()))
        })
        .collect();
    if per_thread {
        titles.push(Cell::from("thread"));
    }
    titles.push(Cell::from(match state.grouping {
        Grouping::Stack => "stack (Enter: full stack)",
        Grouping::Cause => "stacks",
    }));
    let mut widths = vec![
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(17),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(11),
        Constraint::Length(7),
    ];
    if per_thread {
        widths.push(Constraint::Length(20));
    }
    widths.push(Constraint::Min(10));
    let body: Vec<TableRow> = rows.iter().map(|r| table_row(r, per_thread)).collect();
    let table = Table::new(body, widths)
        .header(TableRow::new(titles).style(Style::new().add_modifier(Modifier::REVERSED)))
        .row_highlight_style(Style::new().bg(Color::Blue).fg(Color::White))
        .highlight_symbol("›");
    let mut table_state =
        TableState::default().with_selected((!rows.is_empty()).then_some(state.selected()));
    frame.render_stateful_widget(table, area, &mut table_state);
}

fn table_row(r: &Row, per_thread: bool) -> TableRow<'static> {
    let mut cells = vec![
        r.kind.label().to_string(),
        r.mode.label().to_string(),
        r.cause.label().to_string(),
        r.count.to_string(),
        human_ns(r.total_ns),
        human_ns(r.avg_ns),
        human_ns(r.p99_ns),
        max_text(r.max_ns, r.max_is_upper_bound),
        format!("{:.1}%", r.share * 100.0),
    ];
    if per_thread {
        cells.push(r.thread.clone().unwrap_or_default());
    }
    cells.push(r.place.clone());
    let style = match r.kind {
        Kind::Wait => Style::new(),
        Kind::Hold => Style::new().fg(Color::Cyan),
    };
    TableRow::new(cells).style(style)
}

fn draw_stack_pane(frame: &mut Frame, area: Rect, row: Option<&Row>) {
    let Some(r) = row else {
        let block = Block::default().borders(Borders::TOP).title(" stack ");
        frame.render_widget(Paragraph::new("no row selected").block(block), area);
        return;
    };
    let title = format!(
        " {} {} ({}): {} in {}, avg {}, max {} ",
        r.kind.label(),
        r.mode.label(),
        r.cause.label(),
        human_ns(r.total_ns),
        r.count,
        human_ns(r.avg_ns),
        max_text(r.max_ns, r.max_is_upper_bound)
    );
    let block = Block::default().borders(Borders::TOP).title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let columns = Layout::horizontal(vec![Constraint::Fill(1); r.detail.len().max(1)])
        .spacing(2)
        .split(inner);
    for (lines, column) in r.detail.iter().zip(columns.iter()) {
        let lines: Vec<Line> = lines.iter().map(|l| Line::from(l.clone())).collect();
        frame.render_widget(Paragraph::new(lines), *column);
    }
}

fn key_line() -> &'static str {
    "q quit  space pause  r reset  t threads  c cause/stack  w/h wait/hold  i interval  \
     1-9 sort  Enter stack  ? help"
}

const HELP: &[&str] = &[
    "q, Ctrl-C   quit (requested exports are still written)",
    "space       pause / resume the display (tracing goes on)",
    "r           reset: the cumulative table starts again from now",
    "t           per-thread rows on / off",
    "c           group rows by call stack or by cause",
    "w / h       waits only / holds only (again: both)",
    "i           table shows the last interval or the cumulative window",
    "1..9        sort by kind mode cause count total avg p99 max share",
    "            (the same key again reverses; < and > move the sort column)",
    "↑ ↓ PgUp PgDn Home End   move the selection",
    "Enter       open / close the selected row's full stack (Esc closes)",
    "?           this help (any key closes it)",
    "",
    "max: ≤ marks an upper bound; an interval's maximum is exact only when it",
    "set a new record, otherwise its log2 histogram slot bounds it.",
    "share: total of the row / thread time of the window.",
];

fn draw_help(frame: &mut Frame) {
    let area = frame.area();
    let width = 80.min(area.width);
    let height = (HELP.len() as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, popup);
    let lines: Vec<Line> = HELP.iter().map(|l| Line::from(*l)).collect();
    let block = Block::default().borders(Borders::ALL).title(" keys ");
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
