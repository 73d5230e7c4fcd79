//! Logging: `tracing` to stderr, filtered by `MCAST_LOG` (default `warn`), lines prefixed with
//! `mcast` and the process id. Installed once; a subscriber the host program already set wins.

use std::sync::Once;

/// Installs the subscriber on first call; later calls do nothing.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::EnvFilter;
        let spec = std::env::var("MCAST_LOG").unwrap_or_default();
        let spec = if spec.trim().is_empty() { "warn".to_string() } else { spec };
        let (filter, bad) = match EnvFilter::try_new(&spec) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new("warn"), Some(e)),
        };
        let pid = std::process::id();
        let result = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .without_time()
            .with_thread_names(false)
            .event_format(Prefixed { pid })
            .try_init();
        if result.is_ok() {
            if let Some(e) = bad {
                tracing::warn!("MCAST_LOG={spec:?} is not a valid filter ({e}); using \"warn\"");
            }
        }
    });
}

/// Formats each event as `mcast[pid] LEVEL message fields`.
struct Prefixed {
    pid: u32,
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Prefixed
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
        write!(writer, "mcast[{}] {} ", self.pid, event.metadata().level())?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
