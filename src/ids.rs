//! The numbers that name a repository and a worktree across the crate, each a type of its
//! own so that one is never passed where the other is meant. Both are the store's row
//! ids; they print as the number (in paths, messages and JSON).

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! row_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::num::ParseIntError;

            fn from_str(s: &str) -> Result<$name, Self::Err> {
                s.parse().map($name)
            }
        }
    };
}

row_id!(
    /// A worktree's id: its row in the store, its directory `<state>/worktrees/<id>`.
    WorktreeId
);
row_id!(
    /// A repository's id: its row in the store.
    RepoId
);

#[cfg(test)]
mod tests {
    use super::*;

    /// An id prints, parses and serializes as its number, and nothing else.
    #[test]
    fn an_id_reads_and_prints_as_its_number() {
        assert_eq!(WorktreeId(42).to_string(), "42");
        assert_eq!("42".parse::<WorktreeId>(), Ok(WorktreeId(42)));
        assert!("x".parse::<RepoId>().is_err());
        assert_eq!(serde_json::to_string(&RepoId(7)).unwrap(), "7");
        assert_eq!(
            serde_json::from_str::<WorktreeId>("7").unwrap(),
            WorktreeId(7)
        );
    }
}
