//! A failure with a kind its callers decide on, the words that say what was being done,
//! and the failure beneath (another library's error, the file system's). Each layer has
//! its own kinds (`git::GitErrorKind`, `lifecycle::LifecycleErrorKind`); the chain is
//! kept and printed here once, as `what: what beneath: cause` (`{:#}`, and through
//! anyhow at the top, give the same words).

use std::error::Error as StdError;
use std::fmt;

type Cause = Box<dyn StdError + Send + Sync + 'static>;

enum Said {
    /// Another library's error, shown as it is.
    Cause(Cause),
    /// Words of the layer's own.
    Message(String),
    /// What was being done, and the failure beneath it.
    Context(String, Box<dyn Link>),
    /// Another layer's failure, as it is.
    Within(Box<dyn Link>),
}

/// A failure beneath another, whatever its layer's kinds.
trait Link: StdError + Send + Sync + 'static {
    fn io_error(&self) -> Option<&std::io::Error>;
    fn said(&self) -> Option<&Cause>;
}

/// A failure of kind `K`.
pub struct Failure<K> {
    kind: K,
    said: Said,
}

impl<K: Copy + fmt::Debug + Send + Sync + 'static> Failure<K> {
    /// A failure in the layer's own words.
    pub fn new(kind: K, message: impl Into<String>) -> Failure<K> {
        Failure {
            kind,
            said: Said::Message(message.into()),
        }
    }

    /// Another library's error `cause`, as a failure of kind `kind`.
    pub fn caused(kind: K, cause: impl StdError + Send + Sync + 'static) -> Failure<K> {
        Failure {
            kind,
            said: Said::Cause(Box::new(cause)),
        }
    }

    /// Another layer's failure `inner`, as it is, as kind `kind`.
    pub fn within<J: Copy + fmt::Debug + Send + Sync + 'static>(
        kind: K,
        inner: Failure<J>,
    ) -> Failure<K> {
        Failure {
            kind,
            said: Said::Within(Box::new(inner)),
        }
    }

    pub fn kind(&self) -> K {
        self.kind
    }

    /// This failure beneath `what` (what was being done), of the same kind.
    pub fn context(self, what: impl fmt::Display) -> Failure<K> {
        Failure {
            kind: self.kind,
            said: Said::Context(what.to_string(), Box::new(self)),
        }
    }

    /// This failure as the kind `kind`.
    pub fn with_kind(mut self, kind: K) -> Failure<K> {
        self.kind = kind;
        self
    }

    /// The file system's failure at the bottom of the chain, if that is what it was (a
    /// full disk is said as such).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        Link::io_error(self)
    }
}

impl<K: Copy + fmt::Debug + Send + Sync + 'static> Link for Failure<K> {
    fn io_error(&self) -> Option<&std::io::Error> {
        match &self.said {
            Said::Cause(c) => c.downcast_ref::<std::io::Error>(),
            Said::Message(_) => None,
            Said::Context(_, inner) | Said::Within(inner) => inner.io_error(),
        }
    }

    fn said(&self) -> Option<&Cause> {
        match &self.said {
            Said::Cause(c) => Some(c),
            Said::Within(inner) => inner.said(),
            _ => None,
        }
    }
}

impl<K: Copy + fmt::Debug + Send + Sync + 'static> fmt::Display for Failure<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.said {
            Said::Cause(c) => c.fmt(f)?,
            Said::Message(m) | Said::Context(m, _) => f.write_str(m)?,
            Said::Within(inner) => write!(f, "{inner}")?,
        }
        if f.alternate() {
            write_causes(f, self)?;
        }
        Ok(())
    }
}

impl<K: Copy + fmt::Debug + Send + Sync + 'static> fmt::Debug for Failure<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Failure({:?}: {self:#})", self.kind)
    }
}

impl<K: Copy + fmt::Debug + Send + Sync + 'static> StdError for Failure<K> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.said {
            Said::Cause(c) => c.source(),
            Said::Message(_) => None,
            // A cause beneath is its own link (as a person reads it, and for whoever
            // looks for an `io::Error` in the chain).
            Said::Context(_, inner) => match inner.said() {
                Some(c) => Some(c.as_ref()),
                None => Some(inner.as_ref() as &(dyn StdError + 'static)),
            },
            Said::Within(inner) => inner.source(),
        }
    }
}

/// Writes `err`'s causes, each after `: `, as anyhow's `{:#}` ends an error's words: what
/// an error's own `{:#}` adds to its `{}`.
pub fn write_causes(f: &mut impl fmt::Write, err: &(dyn StdError + 'static)) -> fmt::Result {
    let mut next = err.source();
    while let Some(c) = next {
        write!(f, ": {c}")?;
        next = c.source();
    }
    Ok(())
}

/// Declares `$name`, the trait that gives results whose error becomes a
/// `Failure<$kind>` the methods `context` and `with_context` (one trait per layer, so
/// the kind is never to be guessed).
macro_rules! context_trait {
    ($(#[$doc:meta])* $vis:vis $name:ident, $kind:ty) => {
        $(#[$doc])*
        $vis trait $name<T> {
            /// The error beneath `what` (what was being done).
            fn context(
                self,
                what: impl ::std::fmt::Display,
            ) -> ::std::result::Result<T, $crate::failure::Failure<$kind>>;
            /// The error beneath `what()`, made only on failure.
            fn with_context<W: ::std::fmt::Display>(
                self,
                what: impl FnOnce() -> W,
            ) -> ::std::result::Result<T, $crate::failure::Failure<$kind>>;
        }

        impl<T, E: Into<$crate::failure::Failure<$kind>>> $name<T> for ::std::result::Result<T, E> {
            fn context(
                self,
                what: impl ::std::fmt::Display,
            ) -> ::std::result::Result<T, $crate::failure::Failure<$kind>> {
                self.map_err(|e| e.into().context(what))
            }

            fn with_context<W: ::std::fmt::Display>(
                self,
                what: impl FnOnce() -> W,
            ) -> ::std::result::Result<T, $crate::failure::Failure<$kind>> {
                self.map_err(|e| e.into().context(what()))
            }
        }
    };
}

pub(crate) use context_trait;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Outer,
        Inner,
    }

    crate::failure::context_trait!(TestContext, Kind);

    /// How the callers show a failure: each link of the chain, as anyhow's `{:#}` does.
    fn chain(e: &(dyn StdError + 'static)) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(c) = next {
            out.push_str(": ");
            out.push_str(&c.to_string());
            next = c.source();
        }
        out
    }

    fn full_disk() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOSPC)
    }

    #[test]
    fn the_chain_reads_outermost_first_and_keeps_the_kind() {
        let make = || {
            Failure::caused(Kind::Inner, full_disk())
                .context("writing the index")
                .context("making the entry")
                .with_kind(Kind::Outer)
        };
        let e = make();
        assert_eq!(e.kind(), Kind::Outer);
        assert_eq!(e.to_string(), "making the entry");
        let want = format!("making the entry: writing the index: {}", full_disk());
        assert_eq!(chain(&e), want);
        assert_eq!(format!("{e:#}"), want);
        // Through anyhow (the daemon's and the command line's), the same words.
        assert_eq!(format!("{:#}", anyhow::Error::from(make())), want);
        // The io::Error is its own link, and found from the top.
        let mut next: Option<&(dyn StdError + 'static)> = Some(&e);
        let mut found = false;
        while let Some(c) = next {
            found |= c.downcast_ref::<std::io::Error>().is_some();
            next = c.source();
        }
        assert!(found);
        assert_eq!(e.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        let bare = Failure::caused(Kind::Inner, full_disk());
        assert_eq!(bare.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        assert!(Failure::new(Kind::Inner, "no").io_error().is_none());
    }

    #[test]
    fn a_failure_of_another_layer_stays_readable_beneath() {
        let inner = Failure::caused(Kind::Inner, full_disk()).context("writing HEAD");
        let e: Failure<u8> = Failure::within(7, inner).context("creating the entry");
        assert_eq!(e.kind(), 7);
        assert_eq!(
            format!("{e:#}"),
            format!("creating the entry: writing HEAD: {}", full_disk())
        );
        assert_eq!(e.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        // As it is, in another layer's kind: the same words, the same cause.
        let make = || Failure::caused(Kind::Inner, full_disk()).context("writing HEAD");
        let e: Failure<u8> = Failure::within(3, make());
        assert_eq!(format!("{e:#}"), format!("{:#}", make()));
        assert_eq!(chain(&e), format!("{:#}", make()));
        assert_eq!(e.io_error().unwrap().raw_os_error(), Some(libc::ENOSPC));
        let e: Failure<u8> = Failure::within(3, Failure::caused(Kind::Inner, full_disk()));
        assert_eq!(format!("{e:#}"), full_disk().to_string());
        assert_eq!(e.context("making it").to_string(), "making it");
    }

    #[test]
    fn a_library_error_shows_as_itself() {
        let e = Failure::caused(Kind::Inner, std::io::Error::other("no such ref"));
        assert_eq!(e.to_string(), "no such ref");
        let r: Result<(), Failure<Kind>> = Err(Failure::new(Kind::Inner, "x"));
        let e = r.with_context(|| "reading HEAD").unwrap_err();
        assert_eq!(format!("{e:#}"), "reading HEAD: x");
        let r: Result<(), Failure<Kind>> = Err(Failure::new(Kind::Inner, "y"));
        let e = r.context("z").unwrap_err();
        assert_eq!(format!("{e:#}"), "z: y");
    }
}
