//! Reading the pause a 429 states only in its body, as Google's APIs do (Gemini).

use std::time::Duration;

use serde_json::Value;

use super::headers::go_duration;

/// The pause in a Google RPC error body: the `retryDelay` of its `google.rpc.RetryInfo`
/// detail (`"37s"`, `"1.5s"`), clamped to [`MAX_RETRY_AFTER`](crate::MAX_RETRY_AFTER). The
/// error may sit at the top (`{"error": {...}}`) or in a list of one, as Gemini's
/// OpenAI-compatible endpoint sends it. `None` for any other body, or a delay that can't be
/// read.
pub(crate) fn retry_info_delay(body: &[u8]) -> Option<Duration> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = match &value {
        Value::Array(items) => items.first()?.get("error")?,
        _ => value.get("error")?,
    };
    error
        .get("details")?
        .as_array()?
        .iter()
        .filter(|detail| {
            detail
                .get("@type")
                .and_then(Value::as_str)
                .is_some_and(|kind| kind.ends_with("google.rpc.RetryInfo"))
        })
        .find_map(|detail| detail.get("retryDelay")?.as_str().and_then(go_duration))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::MAX_RETRY_AFTER;

    fn body(delay: &str) -> Vec<u8> {
        format!(
            r#"{{"error": {{"code": 429, "message": "Resource has been exhausted", "status": "RESOURCE_EXHAUSTED",
            "details": [{{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []}},
                        {{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "{delay}"}}]}}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn gemini_retry_delays_are_read_from_the_body() {
        assert_eq!(
            retry_info_delay(&body("37s")),
            Some(Duration::from_secs(37))
        );
        assert_eq!(
            retry_info_delay(&body("1.500s")),
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(retry_info_delay(&body("90000s")), Some(MAX_RETRY_AFTER));
        let listed = format!("[{}]", String::from_utf8(body("2s")).unwrap());
        assert_eq!(
            retry_info_delay(listed.as_bytes()),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn bodies_without_a_readable_retry_info_have_no_delay() {
        for bad in [
            &b""[..],
            b"[]",
            b"{}",
            b"{\"error\": {\"details\": \"x\"}}",
            b"{\"error\": {\"details\": [{\"retryDelay\": \"3s\"}]}}",
            br#"{"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": 3}]}}"#,
        ] {
            assert_eq!(retry_info_delay(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(retry_info_delay(&body("-3s")), None);
        assert_eq!(retry_info_delay(&body("soon")), None);
    }
}

#[cfg(test)]
mod documented {
    #[test]
    fn retry_info_delay_reads_as_documented() {
        use crate::http::retry_info::retry_info_delay;
        use std::time::Duration;

        let body = br#"{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
          "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}]}}"#;
        assert_eq!(retry_info_delay(body), Some(Duration::from_secs(37)));
        assert_eq!(retry_info_delay(b"not json"), None);
    }
}
