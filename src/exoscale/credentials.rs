//! API key and secret. The secret never appears in Debug or Display output.

use std::fmt;

/// The API secret. Debug prints a placeholder so it cannot leak into logs or errors.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiSecret(String);

impl ApiSecret {
    pub fn new(secret: impl Into<String>) -> Self {
        ApiSecret(secret.into())
    }

    /// The raw secret, for signing only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for ApiSecret {
    fn from(secret: String) -> Self {
        ApiSecret(secret)
    }
}

impl From<&str> for ApiSecret {
    fn from(secret: &str) -> Self {
        ApiSecret(secret.to_string())
    }
}

impl fmt::Debug for ApiSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiSecret(<redacted>)")
    }
}

/// An API key (public identifier, safe to log) and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub key: String,
    pub secret: ApiSecret,
}

impl Credentials {
    pub fn new(key: impl Into<String>, secret: impl Into<String>) -> Self {
        Credentials {
            key: key.into(),
            secret: ApiSecret::new(secret),
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("key", &self.key)
            .field("secret", &self.secret)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let c = Credentials::new("EXOkey", "very-secret-value");
        let shown = format!("{c:?} {:?}", c.secret);
        assert!(shown.contains("EXOkey"));
        assert!(!shown.contains("very-secret-value"), "{shown}");
        assert_eq!(c.secret.expose(), "very-secret-value");
    }
}
