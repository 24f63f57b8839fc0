//! Progress on long commands (issue #22): bars with rate and time left, and spinners for
//! single long operations. Drawn on standard error, and only when it is a terminal
//! (indicatif hides them otherwise), so scripts and pipes see the plain output only.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::time::Duration;

/// What a bar counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Objects,
    Groups,
    Bytes,
}

impl Unit {
    /// Below this much work a bar would be over before it helps.
    fn worth_showing(self, total: u64) -> bool {
        match self {
            Unit::Objects | Unit::Groups => total > 64,
            Unit::Bytes => total > 64 << 20,
        }
    }

    fn template(self) -> &'static str {
        match self {
            Unit::Objects => "{msg} [{bar:24}] {pos}/{len} objects, {per_sec}, {eta} left",
            Unit::Groups => "{msg} [{bar:24}] {pos}/{len} groups, {per_sec}, {eta} left",
            Unit::Bytes => {
                "{msg} [{bar:24}] {bytes}/{total_bytes}, {binary_bytes_per_sec}, {eta} left"
            }
        }
    }
}

/// A progress callback `(done, total)` counting `unit`s, drawing a bar for large work.
pub fn bar(what: String, unit: Unit) -> impl FnMut(u64, u64) + Send {
    let mut bar: Option<ProgressBar> = None;
    move |done, total| {
        if !unit.worth_showing(total) {
            return;
        }
        let b = bar.get_or_insert_with(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(unit.template()) {
                b.set_style(style.progress_chars("=> "));
            }
            b.set_message(what.clone());
            b
        });
        b.set_position(done);
        if done >= total {
            b.finish();
        }
    }
}

/// A spinner with the time elapsed, for one long operation (`put`/`get` of a large
/// object); cleared when dropped.
pub struct Spinner(Option<ProgressBar>);

impl Spinner {
    pub fn new(msg: String) -> Spinner {
        let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if b.is_hidden() {
            return Spinner(None);
        }
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            b.set_style(style);
        }
        b.set_message(msg);
        b.enable_steady_tick(Duration::from_millis(120));
        Spinner(Some(b))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            b.finish_and_clear();
        }
    }
}
