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
    let _ = tracing_subscriber::util::SubscriberInitExt::try_init(subscriber(
        &filter,
        || LossyStderr,
        std::io::stderr().is_terminal(),
    ));
}

/// The daemon's subscriber: records `filter` lets through, written to `writer`.
fn subscriber<W>(filter: &str, writer: W, ansi: bool) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(writer)
        .with_ansi(ansi)
        .log_internal_errors(false)
        .finish()
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
