//! What a response meant, and the error an adapter answers for a 429 no retry can fix.

use std::fmt;
use std::time::Duration;

/// What a response meant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Not a 429: the call went through (whatever its status).
    Passed,
    /// A rate limit: worth retrying after the pause (the key is paused for it already).
    Transient {
        /// The provider's pause, when it gave one.
        pause: Option<Duration>,
    },
    /// A 429 no retry can fix: a spent quota or a spend limit.
    Permanent {
        /// The error code the body gave, if any.
        code: Option<String>,
        /// The provider's own words (`error.message`), if the body had them.
        message: Option<String>,
    },
}

/// The error an adapter answers for a permanent 429: retrying it only burns time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermanentRefusal {
    /// The provider profile's name.
    pub profile: String,
    /// The error code the body gave, if any.
    pub code: Option<String>,
    /// The provider's own message, if the body had one.
    pub message: Option<String>,
}

impl fmt::Display for PermanentRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} refused the call for good (429", self.profile)?;
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        write!(
            f,
            "): the quota or spend limit is used up; retrying will not help"
        )?;
        if let Some(message) = &self.message {
            write!(f, ". The provider said: {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PermanentRefusal {}
