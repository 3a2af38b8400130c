//! What a checkout writes for a blob: git's checkout conversions (`convert.c`), decided
//! from a path's attributes and the configuration, and done here for end-of-line and
//! `ident` (the conversions that need no program). Filters and `working-tree-encoding`
//! are left to git itself (`git/filters.rs`).
//!
//! The rules are git's, in its order: `ident`, then end of line, then the encoding, then
//! the filter. A checkout streams a blob through `ident` and LF→CRLF when nothing else
//! applies and the end-of-line rule is not `auto`; otherwise it converts in memory, with
//! the "safer autocrlf" checks. The two differ in small ways (which `$Id: … $` counts as
//! another system's), so both are here, and `Conv::streamable` says which applies.
//!
//! - `config.rs`: the settings and a path's attributes; `classify.rs`: what a checkout
//!   does to a path (`Conv`).
//! - `text.rs`: end of line and `ident`; `clean.rs`: what a clean gives back.

mod classify;
mod clean;
mod config;
mod text;

pub use classify::*;
pub use clean::*;
pub use config::*;
pub use text::*;

#[cfg(test)]
mod tests {
    use super::classify::*;
    use super::clean::*;
    use super::config::*;
    use super::text::*;
    use git2::Oid;

    #[test]
    fn what_a_clean_changes_is_found_in_the_blob() {
        assert!(has_crlf(b"a\r\nb"));
        assert!(!has_crlf(b"a\rb\n"));
        assert_eq!(ident_to_git(b"x $Id: foreign $ y"), b"x $Id$ y");
        assert_eq!(ident_to_git(b"$Id: $"), b"$Id$");
        assert_eq!(
            ident_to_git(b"$Id$ and $Id: no end\n$"),
            b"$Id$ and $Id: no end\n$"
        );
        assert_eq!(ident_to_git(b"a$Id$Id: a b $"), b"a$Id$Id$");
        assert_eq!(clean_in_core(b"a\r\nb\r", true, false), b"a\nb\r");
        let cfg = ConvConfig::default();
        assert!(clean_turns_crlf(&attrs(&[("text", "set")]), &cfg));
        assert!(clean_turns_crlf(
            &attrs(&[("eol", "crlf"), ("text", "set")]),
            &cfg
        ));
        assert!(!clean_turns_crlf(&attrs(&[("text", "auto")]), &cfg));
        assert!(!clean_turns_crlf(
            &attrs(&[("text", "auto"), ("eol", "crlf")]),
            &cfg
        ));
        assert!(!clean_turns_crlf(&attrs(&[("text", "unset")]), &cfg));
        assert!(!clean_turns_crlf(&attrs(&[]), &cfg));
        assert!(clean_turns_crlf(&attrs(&[("eol", "lf")]), &cfg));
        assert!(clean_turns_crlf(&attrs(&[("crlf", "input")]), &cfg));
        assert!(may_not_round_trip(b"*.bat text eol=crlf\n", &cfg));
        assert!(!may_not_round_trip(b"* text=auto\n*.png -text\n", &cfg));
    }

    fn attrs(spec: &[(&str, &str)]) -> PathAttrs {
        let mut a = PathAttrs::default();
        for (n, v) in spec {
            a.set(n, AttrValue::parse(v));
        }
        a
    }

    #[test]
    fn classification_follows_gits_decisions() {
        let plain = ConvConfig::default();
        let mut autocrlf = ConvConfig::default();
        autocrlf.set("core.autocrlf", Some("true"));
        let mut filters = ConvConfig::default();
        filters.set("filter.up.smudge", Some("tr a-z A-Z"));
        filters.set("filter.up.required", None);

        assert_eq!(classify(&attrs(&[]), &plain), None);
        assert_eq!(classify(&attrs(&[("text", "set")]), &plain), None);
        assert_eq!(classify(&attrs(&[("text", "auto")]), &plain), None);
        let c = classify(&attrs(&[("text", "set"), ("eol", "crlf")]), &plain).unwrap();
        assert_eq!(
            (c.crlf, c.crlf_out, c.streamable()),
            (CrlfAction::TextCrlf, true, true)
        );
        let c = classify(&attrs(&[("text", "auto"), ("eol", "crlf")]), &plain).unwrap();
        assert_eq!((c.crlf, c.streamable()), (CrlfAction::AutoCrlf, false));
        // eol=crlf alone makes a path text.
        assert!(classify(&attrs(&[("eol", "crlf")]), &plain).is_some());
        // -text wins over eol.
        assert_eq!(
            classify(&attrs(&[("text", "unset"), ("eol", "crlf")]), &plain),
            None
        );
        let c = classify(&attrs(&[]), &autocrlf).unwrap();
        assert_eq!((c.crlf, c.crlf_out), (CrlfAction::AutoCrlf, true));
        assert_eq!(classify(&attrs(&[("text", "unset")]), &autocrlf), None);
        assert_eq!(classify(&attrs(&[("eol", "lf")]), &autocrlf), None);
        let c = classify(&attrs(&[("ident", "set")]), &plain).unwrap();
        assert!(c.ident && c.streamable());
        // An unconfigured filter is no filter.
        assert_eq!(classify(&attrs(&[("filter", "up")]), &plain), None);
        let c = classify(&attrs(&[("filter", "up")]), &filters).unwrap();
        assert!(c.runs_git() && c.required && c.filter.as_deref() == Some("up"));
        assert_eq!(
            classify(&attrs(&[("working-tree-encoding", "UTF8")]), &plain),
            None
        );
        assert!(
            classify(&attrs(&[("working-tree-encoding", "UTF-16")]), &plain)
                .unwrap()
                .runs_git()
        );
    }

    #[test]
    fn a_conversion_reads_back_what_it_wrote() {
        let c = Conv {
            crlf: CrlfAction::AutoCrlf,
            crlf_out: true,
            ident: true,
            filter: Some("my filter=1%".into()),
            required: true,
            encoding: Some("UTF-16LE".into()),
            lfs_size: Some(12345),
        };
        assert_eq!(Conv::parse(&c.encode()), Some(c.clone()));
        assert!(!c.encode().contains(['\0', '\n']));
        assert_eq!(Conv::parse("crlf=nonsense"), None);
    }

    #[test]
    fn eol_and_ident_by_hand() {
        let oid = Oid::hash_object(git2::ObjectType::Blob, b"x").unwrap();
        assert_eq!(lf_to_crlf(b"a\nb\r\nc\r\r\n\n"), b"a\r\nb\r\nc\r\r\n\r\n");
        // auto leaves a file with a CRLF, a lone CR or binary content alone.
        assert_eq!(crlf_in_core(b"a\nb\r\n", CrlfAction::AutoCrlf, true), None);
        assert_eq!(crlf_in_core(b"a\n\0", CrlfAction::AutoCrlf, true), None);
        assert_eq!(
            crlf_in_core(b"a\nb\r\n", CrlfAction::TextCrlf, true).as_deref(),
            Some(&b"a\r\nb\r\n"[..])
        );
        let want = format!("x $Id: {oid} $ y\n");
        assert_eq!(ident_stream(b"x $Id$ y\n", oid), want.as_bytes());
        assert_eq!(
            ident_in_core(b"x $Id$ y\n", oid, true).unwrap(),
            want.as_bytes()
        );
        assert_eq!(
            ident_stream(b"x $Id: old $ y\n", oid),
            want.as_bytes(),
            "an expanded id is replaced"
        );
        // Another system's id (spaces inside) is kept by both.
        assert_eq!(
            ident_stream(b"$Id: a b c $\n", oid),
            b"$Id: a b c $\n".to_vec()
        );
        assert_eq!(
            ident_in_core(b"$Id: a b c $\n", oid, true).unwrap(),
            b"$Id: a b c $\n".to_vec()
        );
        assert_eq!(ident_stream(b"$I", oid), b"$I".to_vec());
        assert_eq!(ident_stream(b"$Id:open\n$", oid), b"$Id:open\n$".to_vec());
    }

    #[test]
    fn lfs_pointers_give_their_size() {
        let p = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n";
        assert_eq!(lfs_pointer_size(p), Some(12345));
        assert_eq!(lfs_pointer_size(b"size 12\n"), None);
    }

    #[test]
    fn attribute_text_that_cannot_convert_is_recognised() {
        let plain = ConvConfig::default();
        let mut crlf = ConvConfig::default();
        crlf.set("core.eol", Some("crlf"));
        assert!(!may_convert(
            b"*.c diff=cpp\n*.png binary -text\n# ident\n",
            &plain
        ));
        assert!(!may_convert(b"* text=auto\n", &plain));
        assert!(may_convert(b"* text=auto\n", &crlf));
        assert!(may_convert(b"*.bat eol=crlf\n", &plain));
        assert!(may_convert(b"[attr]win text eol=crlf\n", &plain));
        assert!(may_convert(b"*.id ident\n", &plain));
        assert!(!may_convert(b"*.up filter=up\n", &plain));
        let mut f = ConvConfig::default();
        f.set("filter.up.smudge", Some("cat"));
        assert!(may_convert(b"*.up filter=up\n", &f));
    }
}
