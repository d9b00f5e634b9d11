//! The live, top-style view. The only module that touches the terminal (ratatui).
//!
//! Three threads: the collect loop (the caller's) takes snapshots and symbolizes new stacks;
//! an input thread turns terminal events into messages; the UI thread owns the terminal and
//! redraws from one channel that carries data snapshots, keys and resizes. The UI never does
//! BPF or symbolization work: it renders model snapshots. `run_ui` is generic over the ratatui
//! backend, so tests drive it with a `TestBackend` and scripted messages.

mod draw;
mod labels;
mod pane;
mod rows;
pub mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use ratatui::{
    backend::Backend,
    crossterm::event::{self, Event, KeyEvent, KeyEventKind},
    Terminal,
};
use tokio::sync::Notify;

use crate::collect::{Ask, Flow, Shown, Sink, Want};
use crate::model::LiveSnapshot;
use state::{Command, ViewState};

/// What the UI thread reacts to.
pub enum Input {
    Data(Box<LiveSnapshot>),
    Key(KeyEvent),
    Resize,
    /// The trace ended (duration, signal, target exit): leave the view.
    Finished,
}

/// The live view seen from the collect loop.
pub struct LiveView {
    every: Duration,
    /// When the next snapshot is due (set at the first tick).
    next: Option<Instant>,
    per_thread: bool,
    to_ui: Sender<Input>,
    commands: Receiver<Command>,
    ui: Option<JoinHandle<Result<()>>>,
    input_stop: Arc<AtomicBool>,
    input: Option<JoinHandle<()>>,
    wakeup: Arc<Notify>,
    /// `r` was pressed: the next snapshot closes the window instead of being shown.
    reset_asked: bool,
}

impl LiveView {
    /// Takes over the terminal (raw mode, alternate screen, and a panic hook that gives it
    /// back) and starts the input and UI threads.
    pub fn start(every: Duration, per_thread: bool) -> Result<Self> {
        let mut terminal = ratatui::try_init().context(
            "starting the live view on this terminal (--no-live gives a report instead)",
        )?;
        let (to_ui, inputs) = mpsc::channel();
        let (to_collector, commands) = mpsc::channel();
        let input_stop = Arc::new(AtomicBool::new(false));
        let input = {
            let (to_ui, stop) = (to_ui.clone(), Arc::clone(&input_stop));
            std::thread::Builder::new()
                .name("live-input".into())
                .spawn(move || forward_terminal_events(&to_ui, &stop))?
        };
        let wakeup = Arc::new(Notify::new());
        let ui = {
            let wakeup = Arc::clone(&wakeup);
            std::thread::Builder::new()
                .name("live-ui".into())
                .spawn(move || {
                    let mut state = ViewState::new(every, per_thread);
                    let ended = run_ui(&mut terminal, &inputs, &to_collector, &mut state);
                    // The collector stops at once rather than at its next tick.
                    wakeup.notify_one();
                    ended
                })?
        };
        Ok(Self {
            every,
            next: None,
            per_thread,
            to_ui,
            commands,
            ui: Some(ui),
            input_stop,
            input: Some(input),
            wakeup,
            reset_asked: false,
        })
    }

    /// Leaves the view and gives the terminal back. Safe to call whatever ended the trace.
    pub fn finish(mut self) {
        let _ = self.to_ui.send(Input::Finished);
        if let Some(ui) = self.ui.take() {
            match ui.join() {
                Ok(Ok(())) => {}
                Ok(Err(err)) => log::warn!("live view: {}", crate::text::error_line(&err)),
                Err(_) => log::warn!("live view panicked; the exports are still written"),
            }
        }
        self.input_stop.store(true, Ordering::Relaxed);
        if let Some(input) = self.input.take() {
            let _ = input.join();
        }
        ratatui::restore();
    }

    fn ui_gone(&self) -> bool {
        self.ui.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Sink for LiveView {
    fn poll(&mut self, now: Instant) -> Want {
        for command in self.commands.try_iter() {
            match command {
                Command::Quit => return Want::Stop,
                Command::Reset => self.reset_asked = true,
                Command::PerThread(on) => {
                    self.per_thread = on;
                    self.next = Some(now);
                }
            }
        }
        if self.ui_gone() {
            // The UI ended on its own (an error or a panic): stop tracing, keep the exports.
            return Want::Stop;
        }
        // The first numbers come after one interval, as the view says: a window of a few
        // milliseconds makes every per-second rate and share in the header noise.
        let next = *self.next.get_or_insert(now + self.every);
        if self.reset_asked || now >= next {
            Want::Snapshot(Ask {
                per_thread: self.per_thread,
                reset: self.reset_asked,
                ..Ask::default()
            })
        } else {
            Want::Nothing
        }
    }

    fn show(&mut self, shown: Shown) -> Result<Flow> {
        if std::mem::take(&mut self.reset_asked) {
            // The snapshot closed the interval and the window starts at it; the fresh window is
            // shown at the next tick, which comes at once.
            self.next = Some(shown.at);
            self.wakeup.notify_one();
            return Ok(Flow::Continue);
        }
        self.next = Some(shown.at + self.every);
        let _ = self.to_ui.send(Input::Data(Box::new(shown.live)));
        Ok(Flow::Continue)
    }

    fn wakeup(&self) -> Option<Arc<Notify>> {
        Some(Arc::clone(&self.wakeup))
    }
}

/// How long the input thread waits for a terminal event before looking at its stop flag:
/// leaving the view waits for it, and a 100 ms slice added that much to the exit after `q`.
const INPUT_POLL: Duration = Duration::from_millis(20);

/// Forwards key presses and resizes until told to stop (polling, so that it can stop).
fn forward_terminal_events(to_ui: &Sender<Input>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match event::poll(INPUT_POLL) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(_) => return,
        }
        let input = match event::read() {
            Ok(Event::Key(key)) if key.kind == KeyEventKind::Press => Input::Key(key),
            Ok(Event::Resize(..)) => Input::Resize,
            Ok(_) => continue,
            Err(_) => return,
        };
        if to_ui.send(input).is_err() {
            return;
        }
    }
}

/// The UI loop: redraws after every message until quit or the end of the trace.
pub fn run_ui<B: Backend>(
    terminal: &mut Terminal<B>,
    inputs: &Receiver<Input>,
    commands: &Sender<Command>,
    state: &mut ViewState,
) -> Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let redraw = |terminal: &mut Terminal<B>, state: &ViewState| {
        terminal
            .draw(|frame| draw::draw(frame, state))
            .map(|_| ())
            .map_err(|e| anyhow!("drawing the live view: {e}"))
    };
    redraw(terminal, state)?;
    while let Ok(input) = inputs.recv() {
        match input {
            Input::Data(snapshot) => state.receive(*snapshot),
            // draw() resizes the buffers to the new terminal size itself.
            Input::Resize => {}
            Input::Key(key) => {
                if let Some(command) = state.on_key(key) {
                    let _ = commands.send(command);
                    if command == Command::Quit {
                        return Ok(());
                    }
                }
            }
            Input::Finished => return Ok(()),
        }
        redraw(terminal, state)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::state::tests::{key, snapshot};
    use super::*;
    use crate::model::self_cost::{self_cost, RunStats};
    use ratatui::{backend::TestBackend, crossterm::event::KeyCode};

    /// Runs the UI over scripted inputs on a 120x30 test terminal; returns the screen and the
    /// commands it sent.
    fn script(inputs: Vec<Input>) -> (Terminal<TestBackend>, Vec<Command>) {
        script_sized(120, 30, inputs)
    }

    fn script_sized(
        width: u16,
        height: u16,
        inputs: Vec<Input>,
    ) -> (Terminal<TestBackend>, Vec<Command>) {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        let (tx, rx) = mpsc::channel();
        for input in inputs {
            tx.send(input).unwrap();
        }
        tx.send(Input::Finished).unwrap();
        let (command_tx, command_rx) = mpsc::channel();
        let mut state = ViewState::new(Duration::from_secs(1), false);
        run_ui(&mut terminal, &rx, &command_tx, &mut state).unwrap();
        (terminal, command_rx.try_iter().collect())
    }

    fn data() -> Input {
        Input::Data(Box::new(snapshot()))
    }

    fn keys(codes: &[KeyCode]) -> impl Iterator<Item = Input> + '_ {
        codes.iter().map(|&c| Input::Key(key(c)))
    }

    fn screen(terminal: &Terminal<TestBackend>) -> String {
        terminal.backend().to_string()
    }

    #[test]
    fn first_frame_before_any_data() {
        let (terminal, _) = script(vec![]);
        assert!(screen(&terminal).contains("the first numbers come after one interval"));
    }

    #[test]
    fn header_and_table_from_a_snapshot() {
        let (terminal, commands) = script(vec![data()]);
        assert!(commands.is_empty());
        insta::assert_snapshot!("table_by_stack", terminal.backend());
    }

    #[test]
    fn sort_by_count_then_select_and_open_the_stack_pane() {
        let mut inputs = vec![data()];
        inputs.extend(keys(&[
            KeyCode::Char('4'),
            KeyCode::Down,
            KeyCode::Down,
            KeyCode::Enter,
        ]));
        let (terminal, _) = script(inputs);
        insta::assert_snapshot!("sorted_by_count_with_stack_pane", terminal.backend());
    }

    #[test]
    fn unavailable_self_cost_says_why_in_the_header() {
        let mut snapshot = snapshot();
        snapshot.interval.self_cost = self_cost(
            &RunStats::Unavailable("needs CAP_SYS_ADMIN".into()),
            1,
            1,
            Default::default(),
        );
        let (terminal, _) = script(vec![Input::Data(Box::new(snapshot))]);
        let text = screen(&terminal);
        assert!(
            text.contains("self-cost: unavailable (needs CAP_SYS_ADMIN)"),
            "{text}"
        );
    }

    #[test]
    fn cause_grouping_and_help() {
        let mut inputs = vec![data()];
        inputs.extend(keys(&[KeyCode::Char('c')]));
        let (terminal, _) = script(inputs);
        insta::assert_snapshot!("grouped_by_cause", terminal.backend());
        let mut inputs = vec![data()];
        inputs.extend(keys(&[KeyCode::Char('?')]));
        let (terminal, _) = script(inputs);
        let text = screen(&terminal);
        assert!(text.contains("keys"), "{text}");
        assert!(
            text.contains("reset: the cumulative table starts again"),
            "{text}"
        );
        assert!(
            text.contains("sort by kind mode cause count total avg p99 max share"),
            "the sortable columns, named from the column table: {text}"
        );
    }

    #[test]
    fn keys_reach_the_collector_and_q_ends_the_ui() {
        let mut inputs = vec![data()];
        inputs.extend(keys(&[
            KeyCode::Char('r'),
            KeyCode::Char('t'),
            KeyCode::Char('q'),
            // Never read: q ended the loop.
            KeyCode::Char('r'),
        ]));
        let (_, commands) = script(inputs);
        assert_eq!(
            commands,
            [Command::Reset, Command::PerThread(true), Command::Quit]
        );
    }

    #[test]
    fn a_resize_redraws_at_the_new_size() {
        let mut terminal = Terminal::new(TestBackend::new(120, 30)).unwrap();
        let (tx, rx) = mpsc::channel();
        let (command_tx, _command_rx) = mpsc::channel();
        let mut state = ViewState::new(Duration::from_secs(1), false);
        tx.send(data()).unwrap();
        tx.send(Input::Finished).unwrap();
        run_ui(&mut terminal, &rx, &command_tx, &mut state).unwrap();
        terminal.backend_mut().resize(90, 20);
        tx.send(Input::Resize).unwrap();
        tx.send(Input::Finished).unwrap();
        run_ui(&mut terminal, &rx, &command_tx, &mut state).unwrap();
        let text = screen(&terminal);
        assert_eq!(text.lines().count(), 20);
        assert!(text.contains("mmapsem-trace  pid 42 (app)"), "{text}");
    }

    // cut_values, shared with the tmux integration tests.
    include!("../../tests/common/screen.rs");

    #[test]
    fn narrow_terminals_drop_columns_but_never_cut_a_value() {
        for (width, height) in [(80, 20), (70, 20), (60, 16), (100, 24), (160, 45)] {
            for per_thread in [false, true] {
                let mut snapshot = snapshot();
                snapshot.per_thread = per_thread;
                let (terminal, _) =
                    script_sized(width, height, vec![Input::Data(Box::new(snapshot))]);
                let text = screen(&terminal);
                let table: Vec<&str> = text.lines().skip(6).take(6).collect();
                assert!(
                    table[0].contains("kind") && table[0].contains("total"),
                    "{text}"
                );
                for line in &table {
                    assert!(
                        cut_values(line).is_empty(),
                        "{width}x{height}: {:?}\n{text}",
                        cut_values(line)
                    );
                }
                assert!(table[1].contains("40.00 ms"), "{text}");
                if width >= 160 {
                    assert!(
                        table[0].contains("avg") && table[0].contains("p99"),
                        "{text}"
                    );
                }
            }
        }
    }

    #[test]
    fn header_lines_end_whole_at_80_columns_and_less() {
        for width in [80, 70, 60, 160] {
            let text = screen(&script_sized(width, 20, vec![data()]).0);
            let lines: Vec<&str> = text
                .lines()
                .map(|l| l.trim_matches('"').trim_end())
                .collect();
            let ends = |i: usize, endings: &[&str]| {
                assert!(
                    endings.iter().any(|e| lines[i].ends_with(e)),
                    "{width} columns, line {i} cut: {:?}\n{text}",
                    lines[i]
                );
            };
            ends(0, &[" s", "ms"]);
            ends(1, &["since start", "in all"]);
            ends(4, &["thread time", "in BPF"]);
            let keys = lines.last().expect("a key line");
            assert!(
                keys.starts_with("q quit") && keys.ends_with("? help"),
                "{width} columns, key line cut: {keys:?}\n{text}"
            );
        }
    }

    #[test]
    fn the_header_keeps_its_place_when_the_table_empties() {
        let full = screen(&script_sized(80, 20, vec![data()]).0);
        let mut empty = snapshot();
        empty.cumulative.entries.clear();
        let empty = screen(&script_sized(80, 20, vec![Input::Data(Box::new(empty))]).0);
        let header = |text: &str| text.lines().nth(6).unwrap().to_string();
        assert_eq!(
            header(&full).find("kind"),
            header(&empty).find("kind"),
            "\n{full}\n{empty}"
        );
    }
}
