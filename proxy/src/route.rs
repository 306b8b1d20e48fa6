//! Which upstream a path goes to, whether it is metered, and the URL it is sent to.

use crate::config::{Family, OtherPaths, Upstream};

/// Whether a call pays its toll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A call the profile meters: estimated, admitted, synced, settled.
    Metered,
    /// Sent on as it is (Anthropic's `count_tokens`, other paths when configured so).
    Unmetered,
}

/// Where one request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The upstream's index in the configuration.
    pub upstream: usize,
    /// Metered or not.
    pub kind: Kind,
    /// The path (and query) to send to the upstream, appended to its base URL's path.
    pub path: String,
}

/// Why a path has no route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoute {
    /// No upstream meters it, and other paths are refused.
    Refused,
    /// No upstream is mounted there.
    Unmounted,
    /// `..` or an empty segment: never forwarded.
    Malformed,
}

/// The paths a family meters (after the mount).
pub fn metered(family: Family, path: &str) -> bool {
    match family {
        Family::OpenAi => matches!(
            path,
            "/v1/chat/completions" | "/v1/responses" | "/v1/completions" | "/v1/embeddings"
        ),
        Family::Anthropic => path == "/v1/messages",
        Family::Azure => azure_deployment(path).is_some_and(|(_, rest)| {
            matches!(rest, "/chat/completions" | "/completions" | "/embeddings")
        }),
    }
}

/// The paths a family passes through unmetered whatever `other_paths` says.
fn free(family: Family, path: &str) -> bool {
    family == Family::Anthropic && path == "/v1/messages/count_tokens"
}

/// An Azure path's deployment name and what follows it:
/// `/openai/deployments/{name}/chat/completions` → (`name`, `/chat/completions`).
pub fn azure_deployment(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/openai/deployments/")?;
    let (name, rest) = rest.split_at(rest.find('/')?);
    (!name.is_empty()).then_some((name, rest))
}

/// A dot, slash or backslash written so that this router sees a name and the upstream, once
/// it decodes the path, sees a step up or another path: `/v1/%2e%2e/v1/chat/completions` must
/// not pass unmetered to a server that normalizes it into a chat call.
fn disguised(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.contains(&b'\\')
        || bytes.windows(3).any(|w| {
            w[0] == b'%'
                && matches!(
                    (w[1], w[2].to_ascii_lowercase()),
                    (b'2', b'e' | b'f') | (b'5', b'c')
                )
        })
}

/// Whether `path` is under `mount` at a segment boundary; the rest if so.
fn under<'p>(path: &'p str, mount: &str) -> Option<&'p str> {
    let rest = path.strip_prefix(mount)?;
    (rest.is_empty() || rest.starts_with('/')).then_some(rest)
}

/// The route of a request's path and query.
///
/// ```
/// use tollgate_proxy::config::{Config, OtherPaths};
/// use tollgate_proxy::route::{Kind, route};
///
/// let config = Config::public(); // openai, then anthropic
/// let chat = route(&config.upstreams, OtherPaths::Pass, "/v1/chat/completions").unwrap();
/// assert_eq!((chat.upstream, chat.kind), (0, Kind::Metered));
/// let messages = route(&config.upstreams, OtherPaths::Pass, "/v1/messages?beta=true").unwrap();
/// assert_eq!((messages.upstream, messages.kind), (1, Kind::Metered));
/// assert_eq!(messages.path, "/v1/messages?beta=true");
/// ```
pub fn route(
    upstreams: &[Upstream],
    other: OtherPaths,
    path_and_query: &str,
) -> Result<Route, NoRoute> {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    if !path.starts_with('/')
        || path.split('/').skip(1).any(|s| s == ".." || s == ".")
        || path.contains("//")
        || disguised(path)
    {
        return Err(NoRoute::Malformed);
    }
    // `/v1/chat/completions/` is the same call to servers that drop or redirect a final slash.
    let path = match path.strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() => trimmed,
        _ => path,
    };
    // The longest mount that holds the path wins; among upstreams on it, the first that
    // meters the path.
    let longest = upstreams
        .iter()
        .filter(|u| under(path, &u.mount).is_some())
        .map(|u| u.mount.len())
        .max()
        .ok_or(NoRoute::Unmounted)?;
    let candidates = || {
        upstreams
            .iter()
            .enumerate()
            .filter(move |(_, u)| u.mount.len() == longest && under(path, &u.mount).is_some())
    };
    let found = candidates()
        .find(|(_, u)| metered(u.family(), under(path, &u.mount).unwrap_or_default()))
        .map(|(i, _)| (i, Kind::Metered))
        .or_else(|| {
            candidates()
                .find(|(_, u)| free(u.family(), under(path, &u.mount).unwrap_or_default()))
                .map(|(i, _)| (i, Kind::Unmetered))
        });
    let (index, kind) = match (found, other) {
        (Some(found), _) => found,
        (None, OtherPaths::Pass) => {
            let (i, _) = candidates().next().ok_or(NoRoute::Unmounted)?;
            (i, Kind::Unmetered)
        }
        (None, OtherPaths::Refuse) => return Err(NoRoute::Refused),
    };
    let upstream = &upstreams[index];
    let rest = under(path, &upstream.mount).unwrap_or_default();
    let rest = match rest.strip_prefix(upstream.strip.as_str()) {
        Some(stripped)
            if !upstream.strip.is_empty() && (stripped.is_empty() || stripped.starts_with('/')) =>
        {
            stripped
        }
        _ => rest,
    };
    let base = upstream.url.path().trim_end_matches('/');
    let mut forward = String::with_capacity(base.len() + rest.len() + 1);
    forward.push_str(base);
    forward.push_str(rest);
    if forward.is_empty() {
        forward.push('/');
    }
    if let Some(query) = query {
        forward.push('?');
        forward.push_str(query);
    }
    Ok(Route {
        upstream: index,
        kind,
        path: forward,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, LimitsFrom};

    fn upstreams() -> Vec<Upstream> {
        let mut gemini = Upstream::new(
            "gemini",
            "https://generativelanguage.googleapis.com/v1beta/openai"
                .parse()
                .unwrap(),
            "gemini",
            LimitsFrom::Headers,
        );
        gemini.mount = "/gemini".to_owned();
        gemini.strip = "/v1".to_owned();
        let azure = Upstream::new(
            "azure",
            "https://x.openai.azure.com".parse().unwrap(),
            "azure-openai",
            LimitsFrom::Headers,
        );
        let mut voyage = Upstream::new(
            "voyage",
            "https://api.voyageai.com".parse().unwrap(),
            "voyage",
            LimitsFrom::Headers,
        );
        voyage.mount = "/voyage".to_owned();
        let mut all = Config::public().upstreams;
        all.extend([gemini, azure, voyage]);
        all
    }

    fn to(path: &str) -> (usize, Kind, String) {
        let route = route(&upstreams(), OtherPaths::Pass, path).unwrap();
        (route.upstream, route.kind, route.path)
    }

    #[test]
    fn each_family_meters_its_own_paths() {
        use Kind::*;
        let s = String::from;
        assert_eq!(
            to("/v1/chat/completions"),
            (0, Metered, s("/v1/chat/completions"))
        );
        assert_eq!(to("/v1/responses"), (0, Metered, s("/v1/responses")));
        assert_eq!(to("/v1/embeddings"), (0, Metered, s("/v1/embeddings")));
        assert_eq!(to("/v1/messages"), (1, Metered, s("/v1/messages")));
        assert_eq!(
            to("/v1/messages/count_tokens"),
            (1, Unmetered, s("/v1/messages/count_tokens"))
        );
        assert_eq!(
            to("/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"),
            (
                3,
                Metered,
                s("/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21")
            )
        );
        assert_eq!(
            to("/gemini/v1/chat/completions"),
            (2, Metered, s("/v1beta/openai/chat/completions"))
        );
        assert_eq!(
            to("/voyage/v1/embeddings"),
            (4, Metered, s("/v1/embeddings"))
        );
        // A final slash changes nothing, and is not forwarded.
        assert_eq!(
            to("/v1/chat/completions/?x=1"),
            (0, Metered, s("/v1/chat/completions?x=1"))
        );
        // Not metered anywhere: the first upstream on the mount takes it, unmetered.
        assert_eq!(to("/v1/models"), (0, Unmetered, s("/v1/models")));
        assert_eq!(to("/voyage/v1/rerank"), (4, Unmetered, s("/v1/rerank")));
    }

    #[test]
    fn other_paths_can_be_refused_and_count_tokens_still_passes() {
        let all = upstreams();
        assert_eq!(
            route(&all, OtherPaths::Refuse, "/v1/models"),
            Err(NoRoute::Refused)
        );
        let count = route(&all, OtherPaths::Refuse, "/v1/messages/count_tokens").unwrap();
        assert_eq!((count.upstream, count.kind), (1, Kind::Unmetered));
    }

    #[test]
    fn paths_that_climb_or_have_no_slash_are_never_forwarded() {
        let all = upstreams();
        for bad in [
            "/v1/../admin",
            "/v1/./chat/completions",
            "//evil.example/v1",
            "v1/chat/completions",
            "*",
            "",
            "/v1/%2e%2e/v1/chat/completions",
            "/v1/%2E./admin",
            "/v1%2fchat/completions",
            "/v1/chat%5Ccompletions",
            "/v1\\..\\admin",
        ] {
            assert_eq!(
                route(&all, OtherPaths::Pass, bad),
                Err(NoRoute::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_mount_matches_whole_segments_only() {
        let mut only = upstreams();
        only.retain(|u| u.name == "voyage");
        assert_eq!(
            route(&only, OtherPaths::Pass, "/voyager/v1/embeddings"),
            Err(NoRoute::Unmounted)
        );
    }
}
