//! Execution IDs: generation and validation.
//!
//! An execution ID names one attempt to run one command on one host. cairn makes them
//! time-ordered (`ex_` + a UUIDv7 in hex) so that listings sort by creation; callers may pick
//! their own with `--id`. Either way the ID travels to the host as a file name, so the alphabet
//! is restricted before anything is sent: `[A-Za-z0-9_-]{1,128}`. The remote script checks the
//! same rule again.

use std::fmt;
use std::str::FromStr;

/// Longest accepted execution ID, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// A validated execution ID.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct ExecutionId(String);

/// Why a string is not an execution ID.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdError {
    #[error("execution ID is empty; IDs are 1-128 characters from A-Z a-z 0-9 _ -")]
    Empty,
    #[error("execution ID is {0} bytes long; the limit is 128 (characters A-Z a-z 0-9 _ -)")]
    TooLong(usize),
    #[error(
        "execution ID contains {0:?} at byte {1}; only A-Z a-z 0-9 _ - are allowed, so that an ID \
         is always a safe file name on the host"
    )]
    BadChar(char, usize),
}

impl ExecutionId {
    /// A new time-ordered ID: `ex_` followed by a UUIDv7 in lower-case hex.
    pub fn generate() -> Self {
        ExecutionId(format!("ex_{}", uuid::Uuid::now_v7().simple()))
    }

    /// Validate a caller-chosen ID.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty);
        }
        if s.len() > MAX_ID_LEN {
            return Err(IdError::TooLong(s.len()));
        }
        for (i, c) in s.char_indices() {
            if !(c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(IdError::BadChar(c, i));
            }
        }
        Ok(ExecutionId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ExecutionId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::parse(s)
    }
}

impl TryFrom<String> for ExecutionId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        Self::parse(&s)
    }
}

impl From<ExecutionId> for String {
    fn from(id: ExecutionId) -> String {
        id.0
    }
}

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_and_time_ordered() {
        let a = ExecutionId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = ExecutionId::generate();
        assert!(ExecutionId::parse(a.as_str()).is_ok());
        assert!(a.as_str().starts_with("ex_"));
        assert!(a < b, "{a} should sort before {b}");
    }

    #[test]
    fn accepts_the_documented_alphabet_up_to_128() {
        assert!(ExecutionId::parse("a").is_ok());
        assert!(ExecutionId::parse("deploy-2026_11_30-A").is_ok());
        assert!(ExecutionId::parse(&"x".repeat(128)).is_ok());
    }

    #[test]
    fn rejects_paths_empty_long_and_control_characters() {
        assert_eq!(ExecutionId::parse(""), Err(IdError::Empty));
        assert_eq!(
            ExecutionId::parse(&"x".repeat(129)),
            Err(IdError::TooLong(129))
        );
        assert_eq!(
            ExecutionId::parse(&"x".repeat(300)),
            Err(IdError::TooLong(300))
        );
        assert_eq!(ExecutionId::parse("../x"), Err(IdError::BadChar('.', 0)));
        assert_eq!(ExecutionId::parse("a\nb"), Err(IdError::BadChar('\n', 1)));
        assert!(ExecutionId::parse("a b").is_err());
        assert!(ExecutionId::parse("a/b").is_err());
        assert!(ExecutionId::parse("é").is_err());
        assert!(ExecutionId::parse("a'b").is_err());
    }
}
