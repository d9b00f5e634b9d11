//! Drawing the live view from its state: header, table, stack pane, key line, help.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{
        Block, Borders, Clear, HighlightSpacing, Paragraph, Row as TableRow, Table, TableState,
    },
    Frame,
};

use super::rows::Row;
use super::state::{max_text, Column, Grouping, KindFilter, ViewState, Window};
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
    frame.render_widget(Paragraph::new(header_lines(state, header.width)), header);
    let rows = state.rows();
    draw_table(frame, table, state, &rows);
    if state.stack_pane {
        draw_stack_pane(frame, pane, rows.get(state.selected()));
    }
    frame.render_widget(Paragraph::new(key_line(keys.width)).style(DIM), keys);
    if state.help {
        draw_help(frame);
    }
}

/// The header, each line in the longest of its forms that fits `width` (a terminal of 80
/// columns gets the short ones rather than lines cut off mid-word).
fn header_lines(state: &ViewState, width: u16) -> Vec<Line<'static>> {
    let Some(s) = state.snapshot() else {
        return vec![Line::from(
            "mmapsem-trace: attached; the first numbers come after one interval",
        )];
    };
    let width = usize::from(width);
    let (name, rest) = (
        format!("mmapsem-trace  {}", traced(&s.cumulative)),
        format!(
            "  threads {}  elapsed {}",
            s.threads_now,
            human_ns(s.elapsed_ns)
        ),
    );
    let refresh = format!("  refresh {}", human_ns(state.interval.as_nanos() as u64));
    let paused = if state.paused { "  PAUSED" } else { "" };
    let mut first = vec![Span::styled(
        if fits(&[&name, &rest, &refresh, paused], width) {
            name
        } else {
            traced(&s.cumulative)
        },
        Style::new().add_modifier(Modifier::BOLD),
    )];
    first.push(Span::raw(rest));
    first.push(Span::raw(refresh));
    if state.paused {
        first.push(Span::styled(paused, WARNING));
    }
    vec![
        Line::from(first),
        Line::from(fitted(width, rates_lines(s))),
        Line::from(worst_line(&s.interval)),
        lost_line(&s.cumulative),
        self_cost_line(&s.interval, width),
        Line::from(view_line(state, s)).style(DIM),
    ]
}

/// Whether `parts` together fit in `width` columns.
fn fits(parts: &[&str], width: usize) -> bool {
    parts.iter().map(|p| p.chars().count()).sum::<usize>() <= width
}

/// The first of `forms` (longest first) that fits `width`, else the last.
fn fitted(width: usize, forms: Vec<String>) -> String {
    let last = forms.len().saturating_sub(1);
    forms
        .into_iter()
        .enumerate()
        .find(|(i, form)| *i == last || form.chars().count() <= width)
        .map(|(_, form)| form)
        .unwrap_or_default()
}

fn rates_lines(s: &LiveSnapshot) -> Vec<String> {
    let secs = (s.interval.duration_ns as f64 / 1e9).max(1e-9);
    let t = &s.interval.totals;
    let (read, write) = (
        t.read.acquisitions as f64 / secs,
        t.write.acquisitions as f64 / secs,
    );
    let (now, since) = (
        s.interval.wait_share * 100.0,
        s.cumulative.wait_share * 100.0,
    );
    vec![
        format!(
            "acquisitions/s  read {read:.0}  write {write:.0}    waiting: {now:.1}% of thread \
             time this interval, {since:.1}% {}",
            since_label(s)
        ),
        format!(
            "acquisitions/s  read {read:.0}  write {write:.0}  waiting {now:.1}% now, {since:.1}% \
             {}",
            since_label(s)
        ),
        format!("acq/s r {read:.0} w {write:.0}  waiting {now:.1}% now, {since:.1}% in all"),
    ]
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

fn lost_line(report: &Report) -> Line<'static> {
    let nonzero = nonzero_lost(report);
    if nonzero.is_empty() {
        Line::from("lost events: none").style(DIM)
    } else {
        Line::from(format!("lost events: {}", nonzero.join(" "))).style(WARNING)
    }
}

/// The programs' cost over the last interval (an estimate: see the text report's footer).
fn self_cost_line(interval: &Report, width: usize) -> Line<'static> {
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
    let ran = human_ns(added_ns);
    Line::from(fitted(
        width,
        vec![
            format!(
                "self-cost this interval  {rate:.0} events/s  {per_event} ns/event  {ran} of \
                 BPF run time{share}"
            ),
            format!("self-cost  {rate:.0} events/s  {per_event} ns/event  {ran} in BPF{share}"),
            format!("self-cost  {rate:.0} ev/s  {per_event} ns/ev  {ran} in BPF"),
        ],
    ))
}

fn view_line(state: &ViewState, s: &LiveSnapshot) -> String {
    let grouping = match state.grouping {
        Grouping::Stack => "by stack",
        Grouping::Cause => "by cause",
        Grouping::Holder => "behind whom (rows: holders; count, total: the waits they caused)",
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
        state.sort.def().title,
        if state.descending { "▼" } else { "▲" }
    )
}

/// A table column: one of the sortable ones, the thread, or the stack (always last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TableColumn {
    Sorted(Column),
    Thread,
    Stack,
}

/// Where the thread column gives way among the sorted columns' `gives_way` ranks (after
/// mode, before max).
const THREAD_GIVES_WAY: u8 = 6;

/// The columns that give way when the table is too narrow for all of them with their values,
/// least telling first (the stack pane shows the rest); those without a rank always stay.
fn give_way_order() -> Vec<TableColumn> {
    let mut ranked: Vec<(u8, TableColumn)> = Column::all()
        .filter_map(|c| c.def().gives_way.map(|rank| (rank, TableColumn::Sorted(c))))
        .chain([(THREAD_GIVES_WAY, TableColumn::Thread)])
        .collect();
    ranked.sort_by_key(|&(rank, _)| rank);
    ranked.into_iter().map(|(_, c)| c).collect()
}

/// The stack column's least width; it takes whatever the others leave.
const STACK_MIN: u16 = 12;
const COLUMN_SPACING: u16 = 1;
/// The selection mark's column.
const MARK_WIDTH: u16 = 1;

/// Which columns to show in `available` cells, each as wide as its widest cell (`needed`, in
/// display order, the stack last): columns give way in `give_way_order()` until the rest fit
/// beside a stack column of STACK_MIN, so that no number or unit is ever cut.
fn fit_columns(needed: &[(TableColumn, u16)], available: u16) -> Vec<(TableColumn, u16)> {
    let mut kept: Vec<(TableColumn, u16)> = needed.to_vec();
    let width = |kept: &[(TableColumn, u16)]| -> u16 {
        kept.iter()
            .map(|&(c, w)| {
                if c == TableColumn::Stack {
                    STACK_MIN
                } else {
                    w
                }
            })
            .sum::<u16>()
            + COLUMN_SPACING * kept.len().saturating_sub(1) as u16
            + MARK_WIDTH
    };
    for column in give_way_order() {
        if width(&kept) <= available {
            break;
        }
        kept.retain(|&(c, _)| c != column);
    }
    kept
}

fn steady_width(column: TableColumn) -> u16 {
    match column {
        TableColumn::Sorted(c) => c.def().steady_width,
        TableColumn::Thread | TableColumn::Stack => 0,
    }
}

fn text_width(text: &str) -> u16 {
    Line::from(text).width() as u16
}

fn draw_table(frame: &mut Frame, area: Rect, state: &ViewState, rows: &[Row]) {
    let per_thread = state.snapshot().is_some_and(|s| s.per_thread);
    let mut columns: Vec<TableColumn> = Column::all().map(TableColumn::Sorted).collect();
    if per_thread {
        columns.push(TableColumn::Thread);
    }
    columns.push(TableColumn::Stack);
    let title = |c: TableColumn| match c {
        TableColumn::Sorted(c) => {
            let mark = match (c == state.sort, state.descending) {
                (false, _) => "",
                (true, true) => "▼",
                (true, false) => "▲",
            };
            format!("{}{mark}", c.def().title)
        }
        TableColumn::Thread => "thread".to_string(),
        TableColumn::Stack => match state.grouping {
            Grouping::Stack => "stack (Enter: full stack)".to_string(),
            Grouping::Cause => "stacks".to_string(),
            Grouping::Holder => "holder (Enter: its holds)".to_string(),
        },
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|&c| cell_text(r, c)).collect())
        .collect();
    let needed: Vec<(TableColumn, u16)> = columns
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let widest = cells
                .iter()
                .map(|row| text_width(&row[i]))
                .max()
                .unwrap_or(0);
            (c, widest.max(text_width(&title(c))).max(steady_width(c)))
        })
        .collect();
    let kept = fit_columns(&needed, area.width);
    let shown = |row: &[String]| -> Vec<String> {
        columns
            .iter()
            .zip(row)
            .filter(|(c, _)| kept.iter().any(|(k, _)| k == *c))
            .map(|(_, text)| text.clone())
            .collect()
    };
    let titles: Vec<String> = shown(&columns.iter().map(|&c| title(c)).collect::<Vec<_>>());
    let widths: Vec<Constraint> = kept
        .iter()
        .map(|&(c, w)| match c {
            TableColumn::Stack => Constraint::Min(STACK_MIN),
            _ => Constraint::Length(w),
        })
        .collect();
    let body: Vec<TableRow> = rows
        .iter()
        .zip(&cells)
        .map(|(r, texts)| {
            let style = match r.kind {
                Kind::Wait => Style::new(),
                Kind::Hold => Style::new().fg(Color::Cyan),
            };
            TableRow::new(shown(texts)).style(style)
        })
        .collect();
    let table = Table::new(body, widths)
        .header(TableRow::new(titles).style(Style::new().add_modifier(Modifier::REVERSED)))
        .column_spacing(COLUMN_SPACING)
        .row_highlight_style(Style::new().bg(Color::Blue).fg(Color::White))
        .highlight_symbol("›")
        // The mark's column stays when no row is selected (an empty table after a reset),
        // so the header does not move.
        .highlight_spacing(HighlightSpacing::Always);
    let mut table_state =
        TableState::default().with_selected((!rows.is_empty()).then_some(state.selected()));
    frame.render_stateful_widget(table, area, &mut table_state);
}

fn cell_text(r: &Row, column: TableColumn) -> String {
    match column {
        TableColumn::Sorted(c) => (c.def().cell)(r),
        TableColumn::Thread => r.thread.clone().unwrap_or_default(),
        TableColumn::Stack => r.place.clone(),
    }
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

/// The keys, as many as fit `width`: quit and help first and last in every form (help lists
/// the others).
fn key_line(width: u16) -> String {
    const KEYS: [&str; 8] = [
        "space pause",
        "r reset",
        "t threads",
        "c cause/stack",
        "w/h wait/hold",
        "i interval",
        "1-9 sort",
        "Enter stack",
    ];
    let forms = (0..=KEYS.len())
        .rev()
        .map(|n| {
            let mut parts = vec!["q quit"];
            parts.extend(&KEYS[..n]);
            parts.push("? help");
            parts.join("  ")
        })
        .collect();
    fitted(width as usize, forms)
}

fn help_lines() -> Vec<String> {
    let titles: Vec<&str> = Column::all().map(|c| c.def().title).collect();
    HELP.iter()
        .map(|line| line.replace("{columns}", &titles.join(" ")))
        .collect()
}

/// The help screen; `{columns}` stands for the sortable columns' titles.
const HELP: &[&str] = &[
    "q, Ctrl-C   quit (requested exports are still written)",
    "space       pause / resume the display (tracing goes on)",
    "r           reset: the cumulative table starts again from now",
    "t           per-thread rows on / off",
    "c           group rows by call stack or by cause",
    "b           rows: the holders waits were charged to (behind whom), by wait caused",
    "w / h       waits only / holds only (again: both)",
    "i           table shows the last interval or the cumulative window",
    "1..9        sort by {columns}",
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
    let help = help_lines();
    let height = (help.len() as u16 + 2).min(area.height);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, popup);
    let lines: Vec<Line> = help.into_iter().map(Line::from).collect();
    let block = Block::default().borders(Borders::ALL).title(" keys ");
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
