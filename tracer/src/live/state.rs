//! What the live view shows and how keys change it. Plain data over model snapshots: no
//! terminal here, so the keys and the rows are tested directly.

use std::cmp::Ordering;
use std::time::Duration;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::model::{
    report::{Entry, Kind, Report},
    LiveSnapshot,
};
use crate::present::human_ns;

use super::labels::stack_labels;
use super::rows::{cause_group_rows, holder_rows, stack_row, Row};

/// What the view asks of the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Start the cumulative window again from now.
    Reset,
    /// Collect rows per thread (true) or per process.
    PerThread(bool),
    Quit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    Stack,
    Cause,
    /// The holders waits were charged to, summed by what names them ("behind whom").
    Holder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindFilter {
    Both,
    Wait,
    Hold,
}

/// Which window the table shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Since the start of the trace or the last reset.
    Cumulative,
    /// The last refresh interval.
    Interval,
}

/// A sortable column of the table: all that makes it, in one entry of `COLUMNS`.
pub struct ColumnDef {
    pub title: &'static str,
    /// Numbers sort largest first, names alphabetically.
    pub descending_by_default: bool,
    /// Rows in this column's ascending order.
    pub order: fn(&Row, &Row) -> Ordering,
    pub cell: fn(&Row) -> String,
    /// A width kept however the values change, so that columns do not move (times: as wide
    /// as the widest `human_ns` under 1000 s, "999.99 ms"); 0: the widest cell's.
    pub steady_width: u16,
    /// When the table is too narrow for every column, columns give way by this rank, lowest
    /// (least telling) first; None: always shown.
    pub gives_way: Option<u8>,
}

/// The sortable columns, in display order. The number keys 1-9 sort by the first nine; `<`
/// and `>` step through all of them.
pub const COLUMNS: [ColumnDef; 9] = [
    ColumnDef {
        title: "kind",
        descending_by_default: false,
        order: |a, b| a.kind.cmp(&b.kind),
        cell: |r| r.kind.label().to_string(),
        steady_width: 0,
        gives_way: None,
    },
    ColumnDef {
        title: "mode",
        descending_by_default: false,
        order: |a, b| a.mode.cmp(&b.mode),
        cell: |r| r.mode.label().to_string(),
        steady_width: 0,
        gives_way: Some(5),
    },
    ColumnDef {
        title: "cause",
        descending_by_default: false,
        order: |a, b| a.cause.label().cmp(b.cause.label()),
        cell: |r| r.cause.label().to_string(),
        steady_width: 0,
        gives_way: Some(3),
    },
    ColumnDef {
        title: "count",
        descending_by_default: true,
        order: |a, b| a.count.cmp(&b.count),
        cell: |r| r.count.to_string(),
        steady_width: 0,
        gives_way: Some(4),
    },
    ColumnDef {
        title: "total",
        descending_by_default: true,
        order: |a, b| a.total_ns.cmp(&b.total_ns),
        cell: |r| human_ns(r.total_ns),
        steady_width: 9,
        gives_way: None,
    },
    ColumnDef {
        title: "avg",
        descending_by_default: true,
        order: |a, b| a.avg_ns.cmp(&b.avg_ns),
        cell: |r| human_ns(r.avg_ns),
        steady_width: 9,
        // total / count: the first to go.
        gives_way: Some(0),
    },
    ColumnDef {
        title: "p99",
        descending_by_default: true,
        order: |a, b| a.p99_ns.cmp(&b.p99_ns),
        cell: |r| human_ns(r.p99_ns),
        steady_width: 9,
        gives_way: Some(1),
    },
    ColumnDef {
        title: "max",
        descending_by_default: true,
        order: |a, b| a.max_ns.cmp(&b.max_ns),
        cell: |r| max_text(r.max_ns, r.max_is_upper_bound),
        steady_width: 10,
        gives_way: Some(7),
    },
    ColumnDef {
        title: "share",
        descending_by_default: true,
        // The share of one window is proportional to the total.
        order: |a, b| a.total_ns.cmp(&b.total_ns),
        cell: |r| format!("{:.1}%", r.share * 100.0),
        steady_width: 0,
        gives_way: Some(2),
    },
];

/// A sortable column: an index into `COLUMNS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column(usize);

impl Column {
    pub fn all() -> impl Iterator<Item = Column> {
        (0..COLUMNS.len()).map(Column)
    }

    /// The column titled `title`.
    ///
    /// # Panics
    /// When no column has that title (a programming error).
    pub fn titled(title: &str) -> Column {
        Column(
            COLUMNS
                .iter()
                .position(|c| c.title == title)
                .unwrap_or_else(|| panic!("no column titled {title}")),
        )
    }

    pub fn def(self) -> &'static ColumnDef {
        &COLUMNS[self.0]
    }
}

/// A maximum, marked when it is only an upper bound (a window's maximum known by its slot).
pub fn max_text(ns: u64, upper_bound: bool) -> String {
    if upper_bound {
        format!("≤{}", human_ns(ns))
    } else {
        human_ns(ns)
    }
}

pub struct ViewState {
    shown: Option<LiveSnapshot>,
    /// The newest snapshot, kept while paused.
    newest: Option<LiveSnapshot>,
    pub interval: Duration,
    pub paused: bool,
    pub help: bool,
    pub stack_pane: bool,
    pub grouping: Grouping,
    pub kinds: KindFilter,
    pub window: Window,
    pub per_thread: bool,
    pub sort: Column,
    pub descending: bool,
    selected: usize,
    selected_id: Option<String>,
}

/// Rows moved by PgUp / PgDn.
const PAGE: usize = 10;

impl ViewState {
    pub fn new(interval: Duration, per_thread: bool) -> Self {
        Self {
            shown: None,
            newest: None,
            interval,
            paused: false,
            help: false,
            stack_pane: false,
            grouping: Grouping::Stack,
            kinds: KindFilter::Both,
            window: Window::Cumulative,
            per_thread,
            sort: Column::titled("total"),
            descending: true,
            selected: 0,
            selected_id: None,
        }
    }

    pub fn snapshot(&self) -> Option<&LiveSnapshot> {
        self.shown.as_ref()
    }

    /// A new snapshot from the collector: shown now, or when unpaused.
    pub fn receive(&mut self, snapshot: LiveSnapshot) {
        if self.paused {
            self.newest = Some(snapshot);
        } else {
            self.shown = Some(snapshot);
            self.follow_selection();
        }
    }

    /// Applies a key; returns what the collector must do, if anything.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Command> {
        if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
            return Some(Command::Quit);
        }
        if self.help && key.code != KeyCode::Char('q') {
            // Any key closes the help.
            self.help = false;
            return None;
        }
        match key.code {
            KeyCode::Char('q') => return Some(Command::Quit),
            KeyCode::Char('?') => self.help = true,
            KeyCode::Char(' ') => self.toggle_pause(),
            KeyCode::Char('r') => return Some(Command::Reset),
            KeyCode::Char('t') => {
                self.per_thread = !self.per_thread;
                return Some(Command::PerThread(self.per_thread));
            }
            KeyCode::Char('c') => self.group_by(Grouping::Cause),
            KeyCode::Char('b') => self.group_by(Grouping::Holder),
            KeyCode::Char('w') => self.filter(KindFilter::Wait),
            KeyCode::Char('h') => self.filter(KindFilter::Hold),
            KeyCode::Char('i') => {
                self.window = match self.window {
                    Window::Cumulative => Window::Interval,
                    Window::Interval => Window::Cumulative,
                };
            }
            KeyCode::Char(digit @ '1'..='9') => {
                let index = digit as usize - '1' as usize;
                if index < COLUMNS.len() {
                    self.sort_by(Column(index));
                }
            }
            KeyCode::Char('<') => self.shift_sort(-1),
            KeyCode::Char('>') => self.shift_sort(1),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-(PAGE as isize)),
            KeyCode::PageDown => self.move_by(PAGE as isize),
            KeyCode::Home => self.select_index(0),
            KeyCode::End => self.select_index(usize::MAX),
            KeyCode::Enter => self.stack_pane = !self.stack_pane,
            KeyCode::Esc => self.stack_pane = false,
            _ => {}
        }
        None
    }

    fn toggle_pause(&mut self) {
        self.paused = !self.paused;
        if !self.paused {
            if let Some(newest) = self.newest.take() {
                self.shown = Some(newest);
                self.follow_selection();
            }
        }
    }

    /// `w` shows waits only, `h` holds only; pressing it again shows both.
    fn filter(&mut self, kind: KindFilter) {
        self.kinds = if self.kinds == kind {
            KindFilter::Both
        } else {
            kind
        };
        self.follow_selection();
    }

    fn sort_by(&mut self, column: Column) {
        if self.sort == column {
            self.descending = !self.descending;
        } else {
            self.sort = column;
            self.descending = column.def().descending_by_default;
        }
        self.follow_selection();
    }

    fn shift_sort(&mut self, by: isize) {
        let next = (self.sort.0 as isize + by).clamp(0, COLUMNS.len() as isize - 1) as usize;
        self.sort = Column(next);
        self.descending = self.sort.def().descending_by_default;
        self.follow_selection();
    }

    fn move_by(&mut self, by: isize) {
        let to = (self.selected as isize + by).max(0) as usize;
        self.select_index(to);
    }

    fn select_index(&mut self, index: usize) {
        let rows = self.rows();
        self.selected = index.min(rows.len().saturating_sub(1));
        self.selected_id = rows.get(self.selected).map(|r| r.id.clone());
    }

    /// Keeps a row the user picked selected after the rows changed order or content; until
    /// the user picks one, the selection stays on its position (the top row, like top).
    fn follow_selection(&mut self) {
        let rows = self.rows();
        if let Some(id) = &self.selected_id {
            if let Some(i) = rows.iter().position(|r| &r.id == id) {
                self.selected = i;
                return;
            }
        }
        self.selected = self.selected.min(rows.len().saturating_sub(1));
    }

    pub fn selected(&self) -> usize {
        self.selected
    }

    /// The report the table shows.
    pub fn table_report(&self) -> Option<&Report> {
        let s = self.shown.as_ref()?;
        Some(match self.window {
            Window::Cumulative => &s.cumulative,
            Window::Interval => &s.interval,
        })
    }

    /// The table's rows, filtered and sorted.
    /// Groups rows by `grouping`, or by stack again when they already are.
    fn group_by(&mut self, grouping: Grouping) {
        self.grouping = if self.grouping == grouping {
            Grouping::Stack
        } else {
            grouping
        };
        self.select_index(0);
    }

    pub fn rows(&self) -> Vec<Row> {
        let Some(report) = self.table_report() else {
            return Vec::new();
        };
        let wanted = |kind: Kind| match self.kinds {
            KindFilter::Both => true,
            KindFilter::Wait => kind == Kind::Wait,
            KindFilter::Hold => kind == Kind::Hold,
        };
        let entries: Vec<&Entry> = report.entries.iter().filter(|e| wanted(e.kind)).collect();
        let mut rows = match self.grouping {
            Grouping::Stack => entries
                .iter()
                .zip(stack_labels(&entries))
                .map(|(e, label)| stack_row(e, label, report))
                .collect(),
            Grouping::Cause => cause_group_rows(&entries, report),
            // Holders are named by the waits charged to them: the kind filter does not apply.
            Grouping::Holder => holder_rows(report),
        };
        self.sort_rows(&mut rows);
        rows
    }

    fn sort_rows(&self, rows: &mut [Row]) {
        let by = self.sort.def().order;
        rows.sort_by(|a, b| {
            let order = by(a, b);
            let order = if self.descending {
                order.reverse()
            } else {
                order
            };
            // Ties: largest total first, then a stable name.
            order
                .then(b.total_ns.cmp(&a.total_ns))
                .then(a.id.cmp(&b.id))
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::live::labels::place;
    use crate::live::pane::why_lines;
    use crate::model::place::last_path_segment;
    use crate::model::{
        build_report,
        report::tests::{attributed, sample},
    };
    use crate::model::{Cause, Frame};

    #[test]
    fn the_stack_pane_says_why() {
        let (harvest, symbols, meta) = attributed();
        let report = build_report(&harvest, &symbols, &meta);
        let hold = &report.entries[0];
        let hold_why = why_lines(hold);
        assert_eq!(hold_why[0], "why:");
        assert!(
            hold_why.contains(&"off CPU: runnable 12%, asleep 50% (D 38%)".to_string()),
            "{hold_why:?}"
        );
        assert!(
            hold_why.iter().any(|l| l.contains("io_schedule")),
            "{hold_why:?}"
        );
        assert!(
            hold_why.contains(&"blocked others: 750.0 µs over 2 waits".to_string()),
            "{hold_why:?}"
        );
        let wait = report
            .entries
            .iter()
            .find(|e| e.cause == Cause::PageFault)
            .unwrap();
        let wait_why = why_lines(wait);
        assert!(
            wait_why.contains(&" 75% write hold [munmap] tid 7".to_string()),
            "{wait_why:?}"
        );
        let row = stack_row(wait, place(wait), &report);
        assert_eq!(row.detail.last().unwrap(), &wait_why, "a column of its own");
        // Entries without attribution keep the two stack columns only.
        let plain = report.entries.iter().find(|e| e.outside_locker).unwrap();
        assert!(why_lines(plain).is_empty());
    }

    pub(crate) fn snapshot() -> LiveSnapshot {
        let (harvest, symbols, meta) = sample();
        let cumulative = build_report(&harvest, &symbols, &meta);
        let mut interval = cumulative.clone();
        interval.duration_ns = 1_000_000_000;
        interval.entries.truncate(2);
        interval.entries[1].max_is_upper_bound = true;
        LiveSnapshot {
            interval,
            cumulative,
            elapsed_ns: 12_300_000_000,
            threads_now: 4,
            per_thread: false,
            was_reset: false,
        }
    }

    pub(crate) fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn state() -> ViewState {
        let mut s = ViewState::new(Duration::from_secs(1), false);
        s.receive(snapshot());
        s
    }

    #[test]
    fn rows_default_to_total_descending() {
        let s = state();
        let rows = s.rows();
        assert_eq!(rows.len(), 5);
        assert!(rows.windows(2).all(|w| w[0].total_ns >= w[1].total_ns));
        assert_eq!(rows[0].place, "munmap", "user frame outside libc");
        assert!(
            (rows[0].share - 0.01).abs() < 1e-9,
            "40 ms of 4 s thread time"
        );
    }

    #[test]
    fn system_wide_rows_name_their_process() {
        let mut snap = snapshot();
        snap.cumulative.target.system_wide = true;
        snap.cumulative.target.pids.clear();
        let mut s = ViewState::new(Duration::from_secs(1), false);
        s.receive(snap);
        let rows = s.rows();
        assert_eq!(rows[0].place, "app 42: munmap");
        assert!(rows.iter().all(|r| r.place.starts_with("app 42: ")));
    }

    #[test]
    fn number_keys_sort_and_repeat_reverses() {
        let mut s = state();
        s.on_key(key(KeyCode::Char('4')));
        assert_eq!((s.sort, s.descending), (Column::titled("count"), true));
        let counts: Vec<u64> = s.rows().iter().map(|r| r.count).collect();
        assert_eq!(counts[0], 2);
        s.on_key(key(KeyCode::Char('4')));
        assert!(!s.descending);
        assert_eq!(s.rows()[0].count, 1);
        s.on_key(key(KeyCode::Char('3')));
        assert_eq!((s.sort, s.descending), (Column::titled("cause"), false));
        assert_eq!(
            s.rows()[0].cause,
            Cause::ProcReader,
            "\"/proc reader\" sorts first"
        );
        s.on_key(key(KeyCode::Char('>')));
        assert_eq!(s.sort, Column::titled("count"));
    }

    #[test]
    fn selection_moves_clamps_and_follows_its_row() {
        let mut s = state();
        s.on_key(key(KeyCode::Down));
        s.on_key(key(KeyCode::Down));
        assert_eq!(s.selected(), 2);
        let id = s.rows()[2].id.clone();
        s.on_key(key(KeyCode::PageDown));
        assert_eq!(s.selected(), 4, "clamped to the last row");
        s.on_key(key(KeyCode::PageUp));
        assert_eq!(s.selected(), 0);
        s.on_key(key(KeyCode::Down));
        s.on_key(key(KeyCode::Down));
        // Sorting by count moves the row; the selection goes with it.
        s.on_key(key(KeyCode::Char('4')));
        assert_eq!(s.rows()[s.selected()].id, id);
    }

    #[test]
    fn b_shows_the_holders_waits_were_charged_to_and_again_the_stacks() {
        let (harvest, symbols, meta) = attributed();
        let report = build_report(&harvest, &symbols, &meta);
        let mut s = ViewState::new(Duration::from_secs(1), false);
        s.receive(LiveSnapshot {
            interval: report.clone(),
            cumulative: report,
            elapsed_ns: 1_000_000_000,
            threads_now: 4,
            per_thread: false,
            was_reset: false,
        });
        s.on_key(key(KeyCode::Char('b')));
        assert_eq!(s.grouping, Grouping::Holder);
        let rows = s.rows();
        let first = &rows[0];
        assert_eq!(
            (first.mode, first.cause),
            (crate::model::report::Mode::Write, Cause::Munmap)
        );
        assert_eq!((first.count, first.total_ns), (2, 750_000));
        assert_eq!(first.max_ns, 40_000_000, "its longest hold");
        assert!(
            first.detail[0].iter().any(|l| l == "holder threads: 7"),
            "{:?}",
            first.detail
        );
        s.on_key(key(KeyCode::Char('b')));
        assert_eq!(s.grouping, Grouping::Stack);
    }

    #[test]
    fn filters_grouping_window_and_commands() {
        let mut s = state();
        s.on_key(key(KeyCode::Char('w')));
        assert!(s.rows().iter().all(|r| r.kind == Kind::Wait));
        s.on_key(key(KeyCode::Char('w')));
        assert_eq!(s.kinds, KindFilter::Both);
        s.on_key(key(KeyCode::Char('c')));
        let causes = s.rows();
        assert_eq!(
            causes.len(),
            5,
            "sample has five (cause, kind, mode) groups"
        );
        assert!(
            causes[0].detail[0][0].contains("in 1"),
            "{:?}",
            causes[0].detail
        );
        s.on_key(key(KeyCode::Char('i')));
        assert_eq!(s.window, Window::Interval);
        assert_eq!(s.on_key(key(KeyCode::Char('r'))), Some(Command::Reset));
        assert_eq!(
            s.on_key(key(KeyCode::Char('t'))),
            Some(Command::PerThread(true))
        );
        assert_eq!(s.on_key(key(KeyCode::Char('q'))), Some(Command::Quit));
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(s.on_key(ctrl_c), Some(Command::Quit));
    }

    #[test]
    fn an_unpicked_selection_stays_on_top() {
        let mut s = state();
        s.on_key(key(KeyCode::Char('4')));
        assert_eq!(s.selected(), 0);
        assert_eq!(s.rows()[0].count, 2);
    }

    #[test]
    fn pause_holds_the_shown_snapshot() {
        let mut s = state();
        s.on_key(key(KeyCode::Char(' ')));
        let mut newer = snapshot();
        newer.cumulative.entries.truncate(1);
        s.receive(newer);
        assert_eq!(s.rows().len(), 5, "paused: still the old snapshot");
        s.on_key(key(KeyCode::Char(' ')));
        assert_eq!(s.rows().len(), 1);
    }

    #[test]
    fn stack_pane_lines_mark_the_kernel_part() {
        let s = state();
        let top = &s.rows()[0];
        assert_eq!(
            top.detail,
            [
                vec!["user frames (fp):", "munmap", "scan_file"],
                vec!["kernel frames:", "__vm_munmap", "do_syscall_64"]
            ]
        );
    }

    fn user_frame(symbol: &str, addr: u64) -> Frame {
        Frame {
            kernel: false,
            module: "/usr/bin/app".into(),
            symbol: Some(symbol.into()),
            offset: Some(addr & 0xff),
            addr,
            ..Frame::default()
        }
    }

    /// An entry whose user stack is `symbols`, innermost first (addresses from the names, so
    /// one name is one place).
    fn entry_with(symbols: &[&str]) -> Entry {
        let mut e = snapshot().cumulative.entries[0].clone();
        e.frames = symbols
            .iter()
            .map(|s| user_frame(s, 0x1000 + s.bytes().map(u64::from).sum::<u64>()))
            .collect();
        e
    }

    fn labels_of(entries: &[Entry]) -> Vec<String> {
        stack_labels(&entries.iter().collect::<Vec<_>>())
    }

    #[test]
    fn rows_named_alike_show_the_caller_that_tells_them_apart() {
        let callers = [
            "map_region",
            "grow_heap",
            "load_file",
            "map_stack",
            "remap",
            "reserve",
        ];
        let entries: Vec<Entry> = callers
            .iter()
            .map(|c| {
                entry_with(&[
                    "app::memory::mmap_checked",
                    c,
                    "app::churn::churn_once",
                    "main",
                ])
            })
            .collect();
        let labels = labels_of(&entries);
        for (label, caller) in labels.iter().zip(callers) {
            assert_eq!(label, &format!("mmap_checked ‹ {caller}"));
        }
        // A row alone under its name keeps the name only.
        assert_eq!(labels_of(&entries[..1]), ["mmap_checked"]);
    }

    #[test]
    fn one_stack_keeps_one_label_across_kinds_and_threads() {
        let mut hold = entry_with(&["mmap_checked", "map_region", "main"]);
        hold.kind = Kind::Hold;
        let wait = entry_with(&["mmap_checked", "map_region", "main"]);
        let other = entry_with(&["mmap_checked", "remap", "main"]);
        let labels = labels_of(&[hold, wait, other]);
        assert_eq!(labels[0], labels[1]);
        assert_ne!(labels[0], labels[2]);
    }

    #[test]
    fn two_calls_from_one_function_are_told_apart_by_their_place_in_it() {
        let mut a = entry_with(&["mmap_checked", "map_region", "main"]);
        let mut b = a.clone();
        a.frames[1] = user_frame("map_region", 0x2010);
        b.frames[1] = user_frame("map_region", 0x2040);
        let labels = labels_of(&[a, b]);
        assert_eq!(
            labels,
            [
                "mmap_checked ‹ map_region+0x10",
                "mmap_checked ‹ map_region+0x40"
            ]
        );
    }

    #[test]
    fn stacks_parting_at_the_naming_frame_show_where_in_it() {
        let mut a = entry_with(&["app::memory::touch_pages", "churn_once"]);
        let mut b = a.clone();
        a.frames[0] = user_frame("app::memory::touch_pages", 0x3086);
        b.frames[0] = user_frame("app::memory::touch_pages", 0x308a);
        assert_eq!(labels_of(&[a, b]), ["touch_pages+0x86", "touch_pages+0x8a"]);
    }

    #[test]
    fn different_stacks_never_share_a_label() {
        // Every stack of up to three frames over three names, under one best frame: the
        // stacks part at different depths, end early (one a prefix of another), or cross
        // ([a, b, c], [a, c, x], [a, b, x]), or part at a frame named like the row (another
        // place in the naming function, or a namesake elsewhere).
        let names = ["a", "b", "other::mmap_checked"];
        let mut stacks: Vec<Vec<&str>> = vec![vec![]];
        for _ in 0..3 {
            let longer: Vec<Vec<&str>> = stacks
                .iter()
                .filter(|s| s.len() == stacks.last().unwrap().len())
                .flat_map(|s| {
                    names.iter().map(move |n| {
                        let mut s = s.clone();
                        s.push(n);
                        s
                    })
                })
                .collect();
            stacks.extend(longer);
        }
        let entries: Vec<Entry> = stacks
            .iter()
            .map(|tail| {
                let mut symbols = vec!["mmap_checked"];
                symbols.extend(tail);
                entry_with(&symbols)
            })
            .collect();
        assert_eq!(entries.len(), 1 + 3 + 9 + 27);
        let labels = labels_of(&entries);
        let unique: std::collections::HashSet<&String> = labels.iter().collect();
        assert_eq!(unique.len(), labels.len(), "{labels:#?}");
    }

    #[test]
    fn long_paths_are_cut_to_their_last_segment() {
        assert_eq!(
            last_path_segment("mmapsem_workload::churn::churn_once"),
            "churn_once"
        );
        assert_eq!(
            last_path_segment("<std::sys::thread::unix::Thread>::new::thread_start"),
            "thread_start"
        );
        assert_eq!(last_path_segment("<Vec<u8> as Drop>::drop"), "drop");
        assert_eq!(last_path_segment("munmap"), "munmap");
    }
}
