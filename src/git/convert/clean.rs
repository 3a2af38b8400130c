//! The clean side: what `git add` would store for a file, and whether a checkout and a
//! clean give back the blob (LFS pointers, CRLF, `ident`).

use git2::Oid;

use super::classify::*;
use super::config::*;
use super::text::*;

/// The size an LFS pointer gives for the file it stands for, if `blob` is one.
pub fn lfs_pointer_size(blob: &[u8]) -> Option<u64> {
    if blob.len() > 1024 {
        return None;
    }
    let text = std::str::from_utf8(blob).ok()?;
    let mut lines = text.lines();
    if !lines
        .next()?
        .starts_with("version https://git-lfs.github.com/spec/")
    {
        return None;
    }
    let mut size = None;
    let mut oid = false;
    for l in lines {
        if let Some(s) = l.strip_prefix("size ") {
            size = s.parse().ok();
        } else if l.starts_with("oid sha256:") {
            oid = true;
        }
    }
    size.filter(|_| oid)
}

/// Whether attribute text `text` (a `.gitattributes` file) could make a checkout convert
/// some file with configuration `cfg`: a cheap over-estimate that spares the attribute
/// look-up of every path in the (many) repositories whose attributes only say `diff=` or
/// `-text`.
pub fn may_convert(text: &[u8], cfg: &ConvConfig) -> bool {
    let eol_crlf = cfg.text_eol_is_crlf();
    any_set_attribute(text, |name, value| match (name, value) {
        ("ident", None) => true,
        ("filter", Some(d)) => cfg.drivers.contains_key(d),
        ("working-tree-encoding", Some(e)) => !e.is_empty() && !is_utf8(e),
        ("eol", Some(v)) => v == "crlf",
        ("text", None) | ("crlf", None) => eol_crlf,
        ("text", Some("auto")) | ("crlf", Some("auto")) => eol_crlf,
        _ => false,
    })
}

/// Whether attribute text `text` could give some file a blob that does not survive a
/// checkout and a clean (`git status` of a checkout whose files were touched lists it):
/// `ident`, a configured filter, an encoding, or an end-of-line rule that is not `auto`.
/// Over-estimates, as `may_convert` does.
pub fn may_not_round_trip(text: &[u8], cfg: &ConvConfig) -> bool {
    any_set_attribute(text, |name, value| match (name, value) {
        ("ident", None) => true,
        ("filter", Some(d)) => cfg.drivers.contains_key(d),
        ("working-tree-encoding", Some(e)) => !e.is_empty() && !is_utf8(e),
        ("eol", Some(_)) => true,
        ("text", None) | ("crlf", None) => true,
        ("text", Some("input")) | ("crlf", Some("input")) => true,
        _ => false,
    })
}

/// Whether git's clean side turns CRLF into LF for a path with attributes `a` whatever its
/// content: an end-of-line rule that is set and not `auto` (an `auto` rule leaves a blob
/// that already has CRLF as it is, both ways).
pub fn clean_turns_crlf(a: &PathAttrs, cfg: &ConvConfig) -> bool {
    let _ = cfg; // core.autocrlf and core.eol only ever give `auto` or nothing here
    let mut crlf = crlf_of(&a.text);
    if crlf == CrlfAction::Undefined {
        crlf = crlf_of(&a.crlf);
    }
    if crlf == CrlfAction::Binary {
        return false;
    }
    let eol_given = matches!(&a.eol, AttrValue::Value(v) if v == "lf" || v == "crlf");
    match crlf {
        CrlfAction::Auto => false,
        CrlfAction::Text | CrlfAction::TextInput | CrlfAction::TextCrlf => true,
        // No rule of its own: `eol` alone makes it text (git's `convert_attrs`).
        _ => eol_given,
    }
}

/// Whether `blob` holds a CRLF line end.
pub fn has_crlf(blob: &[u8]) -> bool {
    blob.windows(2).any(|w| w == b"\r\n")
}

/// What git's clean side makes of `content` for the conversions done in-process (git's
/// `convert_to_git` without filter and encoding): end of line first (every CRLF made LF
/// when `crlf_to_lf`), then `ident` (every `$Id: … $` made `$Id$`).
pub fn clean_in_core(content: &[u8], crlf_to_lf: bool, ident: bool) -> Vec<u8> {
    let mut out = if crlf_to_lf && has_crlf(content) {
        let mut o = Vec::with_capacity(content.len());
        for (i, &c) in content.iter().enumerate() {
            if !(c == b'\r' && content.get(i + 1) == Some(&b'\n')) {
                o.push(c);
            }
        }
        o
    } else {
        content.to_vec()
    };
    if ident {
        out = ident_to_git(&out);
    }
    out
}

/// git's `ident_to_git`: each `$Id: … $` (no line break before its closing dollar) made
/// `$Id$`, scanning as git scans (a dollar that closes one may open the next).
pub(super) fn ident_to_git(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len());
    let mut i = 0;
    while let Some(d) = src[i..].iter().position(|&b| b == b'$') {
        let dollar = i + d;
        out.extend_from_slice(&src[i..=dollar]);
        i = dollar + 1;
        let rest = &src[i..];
        if rest.len() > 3 && rest.starts_with(b"Id:") {
            let Some(close) = rest[3..].iter().position(|&b| b == b'$') else {
                break;
            };
            if rest[3..3 + close].contains(&b'\n') {
                continue;
            }
            out.extend_from_slice(b"Id$");
            i += 3 + close + 1;
        }
    }
    out.extend_from_slice(&src[i..]);
    out
}

/// Whether blob `oid` holding `blob`, checked out with the in-process conversion `conv`
/// (None: written as it is) and cleaned as git cleans it (`crlf_to_lf`, `ident`), comes
/// back as another blob.
pub fn round_trip_changes(
    oid: Oid,
    blob: &[u8],
    conv: Option<&Conv>,
    crlf_to_lf: bool,
    ident: bool,
) -> bool {
    if !crlf_to_lf && !ident {
        return false;
    }
    let checked_out = match conv {
        // An `auto` end-of-line rule comes back as it went (git's clean side undoes what
        // its checkout did, and leaves a blob that has CRLF as it is): only `ident` is
        // looked at, as the in-memory checkout that `auto` takes does it.
        Some(c) if c.crlf.is_auto() && !c.runs_git() => {
            ident_in_core(blob, oid, c.ident).unwrap_or_else(|| blob.to_vec())
        }
        Some(c) if !c.runs_git() => c.apply(oid, blob),
        _ => blob.to_vec(),
    };
    clean_in_core(&checked_out, crlf_to_lf, ident) != blob
}

/// Whether attribute text `text` could make git's clean side (what `git add` and `git
/// status` hash) differ from the file's bytes: any end-of-line rule, `ident`, a
/// configured filter or an encoding. Over-estimates, as `may_convert` does.
pub fn may_clean(text: &[u8], cfg: &ConvConfig) -> bool {
    any_set_attribute(text, |name, value| match (name, value) {
        ("text" | "crlf" | "eol" | "ident", _) => true,
        ("filter", Some(d)) => cfg.drivers.contains_key(d),
        ("working-tree-encoding", Some(e)) => !e.is_empty() && !is_utf8(e),
        _ => false,
    })
}

/// Whether some attribute that attribute text `text` sets or gives a value (not `-x` or
/// `!x`), in a pattern line or a macro definition, satisfies `pred(name, value)`.
pub(super) fn any_set_attribute(text: &[u8], pred: impl Fn(&str, Option<&str>) -> bool) -> bool {
    for line in text.split(|&c| c == b'\n') {
        let line = String::from_utf8_lossy(line);
        let mut words = line.split_whitespace();
        match words.next() {
            None => continue,
            Some(w) if w.starts_with('#') => continue,
            Some(_) => {}
        }
        for w in words {
            let (name, value) = match w.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (w, None),
            };
            if !(name.starts_with('-') || name.starts_with('!')) && pred(name, value) {
                return true;
            }
        }
    }
    false
}
