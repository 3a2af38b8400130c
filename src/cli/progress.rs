//! A long step said on stderr once it has taken over a second, so it is not silent.

use std::time::Duration;

/// Says on stderr what a step that has taken over a second (`WORKTREEFS_PROGRESS_AFTER_MS`)
/// is doing, and each next thing it does, so long work is not silent; nothing when it is
/// quick.
pub struct Slow {
    what: String,
    started: std::time::Instant,
    after: Duration,
    shared: std::sync::Arc<parking_lot::Mutex<SlowState>>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
pub struct SlowState {
    phase: Option<String>,
    said: Option<String>,
    done: bool,
}

impl Slow {
    pub fn start(what: String) -> Slow {
        let after = std::env::var("WORKTREEFS_PROGRESS_AFTER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(1), Duration::from_millis);
        let started = std::time::Instant::now();
        let shared = std::sync::Arc::new(parking_lot::Mutex::new(SlowState::default()));
        let watcher = {
            let shared = shared.clone();
            let what = what.clone();
            std::thread::spawn(move || loop {
                {
                    let mut s = shared.lock();
                    if s.done {
                        return;
                    }
                    if started.elapsed() >= after && s.phase.is_some() && s.phase != s.said {
                        eprintln!("worktreefs: {what}: {}…", s.phase.as_deref().unwrap_or(""));
                        s.said = s.phase.clone();
                    }
                }
                // Woken at once by `finish` (a creation must not wait out the tick).
                std::thread::park_timeout(Duration::from_millis(20));
            })
        };
        Slow {
            what,
            started,
            after,
            shared,
            watcher: Some(watcher),
        }
    }

    /// What it does now: said at once when past the threshold, else by the watcher if
    /// it is still doing it then.
    pub fn note(&self, phase: &str) {
        let mut s = self.shared.lock();
        s.phase = Some(phase.to_string());
        if self.started.elapsed() >= self.after {
            eprintln!("worktreefs: {}: {phase}…", self.what);
            s.said = s.phase.clone();
        }
    }

    /// Ends the watcher; says how long it took if it said anything.
    pub fn finish(mut self, ok: bool) {
        self.shared.lock().done = true;
        if let Some(w) = self.watcher.take() {
            w.thread().unpark();
            let _ = w.join();
        }
        if ok && self.shared.lock().said.is_some() {
            eprintln!(
                "worktreefs: {}: done in {:.1} s",
                self.what,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// A warm snapshot's copying, on a terminal's line of its own: the files and bytes copied
/// so far of those found, redrawn at most ten times a second and wiped when it is done.
/// Nothing when stderr is not a terminal (a pipe or a file gets the summary alone), nor
/// for a command in the background (`warm &`: with `stty tostop` its first write would
/// stop it while it holds the snapshot lock; without, it draws over the foreground's).
pub struct Meter {
    what: String,
    on: bool,
    last: std::cell::Cell<Option<std::time::Instant>>,
    shown: std::cell::Cell<bool>,
}

impl Meter {
    pub fn new(what: String) -> Meter {
        use std::io::IsTerminal;
        // SAFETY: tcgetpgrp and getpgrp only read this process's terminal and group.
        let foreground = unsafe { libc::tcgetpgrp(2) == libc::getpgrp() };
        Meter {
            what,
            on: std::io::stderr().is_terminal() && foreground,
            last: std::cell::Cell::new(None),
            shown: std::cell::Cell::new(false),
        }
    }

    /// How far it has come: shown unless it was shown less than a tenth of a second ago
    /// (the last file always is).
    pub fn tell(&self, c: worktreefs::lifecycle::warm::Copied) {
        if !self.on {
            return;
        }
        let now = std::time::Instant::now();
        let recent = self
            .last
            .get()
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100));
        if recent && c.files < c.of_files {
            return;
        }
        self.last.set(Some(now));
        self.shown.set(true);
        eprint!(
            "\r\x1b[Kworktreefs: {}: {} of {} files, {} of {}",
            self.what,
            c.files,
            c.of_files,
            worktreefs::report::human_bytes(c.bytes),
            worktreefs::report::human_bytes(c.of_bytes)
        );
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.shown.get() {
            eprint!("\r\x1b[K");
        }
    }
}
