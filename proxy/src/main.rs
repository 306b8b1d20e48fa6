//! `tollgate-proxy`: the command. See the crate's README for the configuration file.

use std::process::ExitCode;
use std::time::Duration;

use tollgate_proxy::config::limits_from;
use tollgate_proxy::{Config, Drained, Proxy};

/// mimalloc (the `mimalloc` feature, on by default): measured in BENCHMARKS.md, "The proxy's
/// capacity: the allocator", throughput and the memory of 100,000 keys alike.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "\
tollgate-proxy: an OpenAI- and Anthropic-compatible gateway that keeps every client inside one quota

USAGE:
    tollgate-proxy [--config proxy.toml] [FLAGS]

FLAGS (each overrides the file):
    --listen ADDR           where to listen (default 127.0.0.1:8787)
    --admin-listen ADDR     where the operators' live view listens (/admin/; default: off)
    --upstream URL          the one upstream's base URL (default: the profile's public API)
    --profile NAME          openai, azure-openai, anthropic, voyage, gemini, groq, mistral, generic
    --requests RATE         requests per period, e.g. 500/m (several: \"60/m; 1000/d\")
    --tokens RATE           tokens per period, e.g. 200000/m
    --output-tokens RATE    output tokens per period (Anthropic, Gemini)
                            (no rate at all: limits are learned from the provider's headers)
    --redis URL             share every key with the proxies on this Redis
    --max-body BYTES        larger request bodies get 413 (default 33554432)
    --drain SECONDS         how long calls in flight run on after SIGTERM (default 30)
    --log json|text         log format (default json); RUST_LOG filters (default info)
    --config FILE           a TOML configuration (see the README); SIGHUP reloads it
    --watch SECONDS         also reload the file when it changes, looking this often
    -h, --help              this text
    -V, --version           the version

EXAMPLE:
    tollgate-proxy --upstream https://api.openai.com --profile openai --requests 500/m --tokens 200000/m
    OPENAI_BASE_URL=http://127.0.0.1:8787/v1 python my_script.py
";

#[derive(Default)]
struct Flags {
    config: Option<String>,
    listen: Option<String>,
    admin_listen: Option<String>,
    upstream: Option<String>,
    profile: Option<String>,
    requests: Option<String>,
    tokens: Option<String>,
    output_tokens: Option<String>,
    redis: Option<String>,
    max_body: Option<String>,
    drain: Option<String>,
    log: Option<String>,
    watch: Option<String>,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Option<Flags>, String> {
    let mut flags = Flags::default();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                (name.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let slot = match name.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("tollgate-proxy {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--config" => &mut flags.config,
            "--listen" => &mut flags.listen,
            "--admin-listen" => &mut flags.admin_listen,
            "--upstream" => &mut flags.upstream,
            "--profile" => &mut flags.profile,
            "--requests" => &mut flags.requests,
            "--tokens" => &mut flags.tokens,
            "--output-tokens" => &mut flags.output_tokens,
            "--redis" => &mut flags.redis,
            "--max-body" => &mut flags.max_body,
            "--drain" => &mut flags.drain,
            "--log" => &mut flags.log,
            "--watch" => &mut flags.watch,
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        };
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .ok_or_else(|| format!("{name} needs a value (see --help)"))?,
        };
        *slot = Some(value);
    }
    Ok(Some(flags))
}

fn config(flags: &Flags) -> Result<Config, String> {
    let mut config = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            // An empty file is most likely one being written (or a failed edit): read as the
            // defaults, it would serve the public upstreams with no tenant, key or budget.
            let said = text
                .lines()
                .map(str::trim)
                .any(|line| !line.is_empty() && !line.starts_with('#'));
            if !said {
                return Err(format!(
                    "{path}: the file says nothing (empty, or only comments); to run on the defaults, start without --config"
                ));
            }
            Config::from_toml(&text).map_err(|e| format!("{path}: {e}"))?
        }
        None => Config::public(),
    };
    let single = flags.upstream.is_some()
        || flags.profile.is_some()
        || flags.requests.is_some()
        || flags.tokens.is_some()
        || flags.output_tokens.is_some();
    if single {
        let limits = limits_from(
            flags.requests.as_deref(),
            flags.tokens.as_deref(),
            flags.output_tokens.as_deref(),
        )?;
        let profile = flags.profile.as_deref().unwrap_or("openai");
        let one = Config::single(flags.upstream.as_deref(), profile, limits)
            .map_err(|e| e.to_string())?;
        config.upstreams = one.upstreams;
    }
    if let Some(listen) = &flags.listen {
        config.listen = listen
            .parse()
            .map_err(|e| format!("--listen `{listen}`: {e}"))?;
    }
    if let Some(admin) = &flags.admin_listen {
        config.admin_listen = Some(
            admin
                .parse()
                .map_err(|e| format!("--admin-listen `{admin}`: {e}"))?,
        );
    }
    if let Some(redis) = &flags.redis {
        config.redis = Some(redis.clone());
    }
    if let Some(bytes) = &flags.max_body {
        config.max_body = bytes
            .parse()
            .map_err(|e| format!("--max-body `{bytes}`: {e}"))?;
    }
    if let Some(every) = &flags.watch {
        if flags.config.is_none() {
            return Err("--watch needs --config FILE".to_owned());
        }
        match every.parse::<f64>() {
            Ok(s) if s.is_finite() && (0.1..=86_400.0).contains(&s) => {}
            _ => return Err(format!("--watch `{every}`: 0.1 to 86400 seconds")),
        }
    }
    if let Some(seconds) = &flags.drain {
        let value: f64 = seconds
            .parse()
            .map_err(|e| format!("--drain `{seconds}`: {e}"))?;
        if !(value.is_finite() && (0.0..=86_400.0).contains(&value)) {
            return Err(format!("--drain `{seconds}`: 0 to 86400 seconds"));
        }
        config.drain = Duration::from_secs_f64(value);
    }
    Ok(config)
}

fn logs(format: Option<&str>) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format.unwrap_or("json") {
        "json" => builder.json().flatten_event(true).init(),
        "text" => builder.init(),
        other => return Err(format!("--log `{other}`: json or text")),
    }
    Ok(())
}

/// Reloads the configuration (the file, with the flags over it) on SIGHUP and, with
/// `--watch`, when the file changes. A configuration that can't be used is refused and
/// logged; the one in force stays.
async fn reloads(flags: Flags, reloader: tollgate_proxy::Reloader) {
    let watch = flags
        .watch
        .as_deref()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.1)
        .map(Duration::from_secs_f64);
    // The file's bytes, not its time or size: an edit that keeps both (`cp -p`, `rsync -t`)
    // is still seen. A change is read once the file has stayed the same for one period, so
    // that a file caught half-written is not loaded.
    let contents = |path: &str| std::fs::read(path).ok();
    let mut loaded = flags.config.as_deref().and_then(contents);
    let mut pending: Option<Option<Vec<u8>>> = None;
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let tick = async {
            match watch {
                Some(every) => tokio::time::sleep(every).await,
                None => std::future::pending().await,
            }
        };
        #[cfg(unix)]
        let hung_up = async {
            match hangup.as_mut() {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hung_up = std::future::pending::<Option<()>>();
        let why = tokio::select! {
            _ = hung_up => "SIGHUP",
            () = tick => {
                let now = flags.config.as_deref().and_then(contents);
                if now == loaded {
                    pending = None;
                    continue;
                }
                if pending.as_ref() != Some(&now) {
                    pending = Some(now);
                    continue;
                }
                pending = None;
                loaded = now;
                "the file changed"
            }
        };
        if why == "SIGHUP" {
            loaded = flags.config.as_deref().and_then(contents);
            pending = None;
        }
        tracing::info!(why, "reloading the configuration");
        match config(&flags) {
            Ok(config) => {
                let _ = reloader.reload(config).await;
            }
            Err(err) => {
                tracing::error!(error = %err, "reload refused: the configuration in force stays")
            }
        }
    }
}

/// `url` without the user and password it may carry (`https://user:secret@host/` is logged as
/// `https://***@host/`).
fn without_credentials(url: &str) -> String {
    tollgate_proxy::config::masked(url)
}

/// Completes on SIGTERM or Ctrl-C.
async fn terminated() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => None } } => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

fn main() -> ExitCode {
    let flags = match parse(std::env::args().skip(1)) {
        Ok(Some(flags)) => flags,
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tollgate-proxy: {err}");
            return ExitCode::from(2);
        }
    };
    if let Err(err) = logs(flags.log.as_deref()) {
        eprintln!("tollgate-proxy: {err}");
        return ExitCode::from(2);
    }
    let config = match config(&flags) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("tollgate-proxy: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tollgate-proxy: no runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let upstreams: Vec<String> = config
            .upstreams
            .iter()
            .map(|u| format!("{} {} ({})", u.name, without_credentials(&u.url.to_string()), u.profile))
            .collect();
        let proxy = match Proxy::bind(config).await {
            Ok(proxy) => proxy,
            Err(err) => {
                eprintln!("tollgate-proxy: {err}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(listen = %proxy.local_addr(), upstreams = ?upstreams, "tollgate-proxy listening");
        if let Some(admin) = proxy.admin_addr() {
            tracing::info!(admin = %admin, "the live view: http://{admin}/admin/");
        }
        let reloading = tokio::spawn(reloads(flags, proxy.reloader()));
        let drained = proxy.serve(terminated()).await;
        reloading.abort();
        match drained {
            Drained::Clean => ExitCode::SUCCESS,
            Drained::Cut => ExitCode::from(3),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn a_logged_url_carries_no_credentials() {
        assert_eq!(
            without_credentials("https://user:s3cret@host:8443/v1?x=1"),
            "https://***@host:8443/v1?x=1"
        );
        assert_eq!(
            without_credentials("http://127.0.0.1:1/"),
            "http://127.0.0.1:1/"
        );
        assert_eq!(without_credentials("no scheme"), "no scheme");
    }
}
