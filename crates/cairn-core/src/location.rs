//! Where a journal lives: a file path, or a PostgreSQL URL (shared by replicas). Pure: the
//! journal opens it, the intent key's default place depends on it.

/// Whether `location` names a PostgreSQL journal (`postgres://` or `postgresql://`, any case).
pub fn is_postgres_url(location: &str) -> bool {
    let lower = location.get(..13).unwrap_or(location).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

#[cfg(test)]
mod tests {
    use super::is_postgres_url;

    #[test]
    fn postgres_urls_in_any_case_and_nothing_else() {
        for yes in ["postgres://h/db", "POSTGRESQL://u@h/db", "PostgreS://x"] {
            assert!(is_postgres_url(yes), "{yes}");
        }
        for no in [
            "",
            "postgres:/h",
            "./postgres://x",
            "sqlite://x",
            "journal.db",
            "pg://h",
        ] {
            assert!(!is_postgres_url(no), "{no}");
        }
    }
}
