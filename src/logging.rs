//! Logging: the daemon's log records (stderr, which is `daemon.log` in the background),
//! a command's warnings as sentences for people, and `--log-level` checked as a level.

/// A `--log-level`: a level (error, warn, info, debug, trace, off), or directives as
/// RUST_LOG takes them whose levels are levels (`worktreefs=debug,warn`).
pub fn log_level(s: &str) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let ok = !s.is_empty()
        && s.split(',').all(|d| {
            let level = d
                .rsplit_once('=')
                .map_or(d, |(target, l)| if target.is_empty() { "" } else { l });
            LEVELS.contains(&level.to_ascii_lowercase().as_str())
                && d.parse::<tracing_subscriber::filter::Directive>().is_ok()
        });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}' is not a log level: use one of {} (or TARGET=LEVEL directives, comma-separated)",
            LEVELS.join(", ")
        ))
    }
}

pub fn init(level: Option<&str>) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| level.map(str::to_string))
        .unwrap_or_else(|| "info".into());
    use std::io::IsTerminal;
    // A log line that cannot be written (the log's disk is full) is dropped: never an
    // error, and never the panic that `eprintln!` makes of it (tracing-subscriber's report
    // of a failed write is one), which would end the daemon under its users.
    // try_init also routes the `log` records of fuser through tracing.
    let _ = tracing_subscriber::util::SubscriberInitExt::try_init(subscriber(
        &filter,
        || LossyStderr,
        std::io::stderr().is_terminal(),
    ));
}

/// The daemon's subscriber: records `filter` lets through, but for fuser's expected reply
/// races ([`ReplyRaces`]), written to `writer`.
fn subscriber<W>(filter: &str, writer: W, ansi: bool) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let races = ReplyRaces {
        shown: filter
            .max_level_hint()
            .is_none_or(|l| l >= tracing::level_filters::LevelFilter::DEBUG),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .finish()
        .with(races)
}

/// fuser logs every reply it could not send at error level. One failure is the expected
/// race of a process killed mid-request: its request is gone, and the kernel answers the
/// reply with ENOENT. Those records are kept for a filter that shows debug records
/// (`--log-level debug`); every other failed reply is logged as fuser logs it.
struct ReplyRaces {
    /// The filter shows debug records: the races are shown too.
    shown: bool,
}

/// The target fuser's reply records carry.
const FUSER_REPLY: &str = "fuser::reply";

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ReplyRaces {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if self.shown {
            return true;
        }
        let mut record = ReplyRecord {
            target: event.metadata().target() == FUSER_REPLY,
            gone: false,
        };
        event.record(&mut record);
        !(record.target && record.gone)
    }
}

/// What [`ReplyRaces`] reads of a record: whether it is fuser's (a record of the `log`
/// crate names its target in the field `log.target`), and whether its message is a reply
/// refused because its request is gone.
struct ReplyRecord {
    target: bool,
    gone: bool,
}

impl tracing::field::Visit for ReplyRecord {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "log.target" && value == FUSER_REPLY {
            self.target = true;
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let enoent = std::io::Error::from_raw_os_error(libc::ENOENT).to_string();
            self.gone = format!("{value:?}").ends_with(&enoent);
        }
    }
}

/// Logging for a command run by a person at the default level: warnings and errors only,
/// each as one line `worktreefs: warning: MESSAGE` on standard error.
pub fn init_for_people() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(|| LossyStderr)
        .log_internal_errors(false)
        .event_format(ForPeople)
        .try_init();
}

/// A log event as a sentence: `worktreefs: warning: ` and its message (fields after it).
struct ForPeople;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for ForPeople
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            _ => "note",
        };
        write!(writer, "worktreefs: {level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Standard error for log lines, whose failures are ignored.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what is logged.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What fuser logs, through the `log` crate as fuser does, under `filter`.
    fn logged(filter: &str) -> String {
        let kept = Kept::default();
        let w = kept.clone();
        let _ = tracing_log::LogTracer::init();
        tracing::subscriber::with_default(subscriber(filter, move || w.clone(), false), || {
            let gone = std::io::Error::from_raw_os_error(libc::ENOENT);
            let broken = std::io::Error::from_raw_os_error(libc::EINVAL);
            log::error!(target: FUSER_REPLY, "Failed to send FUSE reply: {gone}");
            log::error!(target: FUSER_REPLY, "Failed to send FUSE reply: {broken}");
            log::error!(target: "fuser::other", "Failed to send FUSE reply: {gone}");
        });
        let text = String::from_utf8(kept.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn a_reply_to_a_request_that_is_gone_is_logged_only_at_debug() {
        let text = logged("info");
        let gone: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("(os error 2)"))
            .collect();
        assert!(
            gone.len() == 1 && gone[0].contains("fuser::other"),
            "only another target's record says ENOENT: {text}"
        );
        assert!(
            text.contains("Invalid argument"),
            "another failure is kept: {text}"
        );
        let text = logged("debug");
        assert_eq!(text.matches("(os error 2)").count(), 2, "{text}");
        assert!(text.contains("Invalid argument"), "{text}");
    }
}
