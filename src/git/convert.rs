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

use std::collections::BTreeMap;

use git2::Oid;

/// The end-of-line rule for a path (git's `enum convert_crlf_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrlfAction {
    Undefined,
    Binary,
    Text,
    TextInput,
    TextCrlf,
    Auto,
    AutoInput,
    AutoCrlf,
}

impl CrlfAction {
    fn name(self) -> &'static str {
        match self {
            CrlfAction::Undefined => "undefined",
            CrlfAction::Binary => "binary",
            CrlfAction::Text => "text",
            CrlfAction::TextInput => "text-input",
            CrlfAction::TextCrlf => "text-crlf",
            CrlfAction::Auto => "auto",
            CrlfAction::AutoInput => "auto-input",
            CrlfAction::AutoCrlf => "auto-crlf",
        }
    }

    fn from_name(s: &str) -> Option<CrlfAction> {
        [
            CrlfAction::Undefined,
            CrlfAction::Binary,
            CrlfAction::Text,
            CrlfAction::TextInput,
            CrlfAction::TextCrlf,
            CrlfAction::Auto,
            CrlfAction::AutoInput,
            CrlfAction::AutoCrlf,
        ]
        .into_iter()
        .find(|a| a.name() == s)
    }

    fn is_auto(self) -> bool {
        matches!(
            self,
            CrlfAction::Auto | CrlfAction::AutoInput | CrlfAction::AutoCrlf
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCrlf {
    #[default]
    False,
    True,
    Input,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eol {
    #[default]
    Unset,
    Lf,
    Crlf,
}

/// A `filter.<name>` driver of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Driver {
    pub smudge: Option<String>,
    pub clean: Option<String>,
    pub process: Option<String>,
    pub required: bool,
}

/// The configuration the conversions depend on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvConfig {
    pub autocrlf: AutoCrlf,
    /// `core.eol` (`native` is LF here).
    pub eol: Eol,
    pub drivers: BTreeMap<String, Driver>,
}

impl ConvConfig {
    /// Sets one configuration variable (lower-cased name, as git's config lists them).
    pub fn set(&mut self, key: &str, value: Option<&str>) {
        let truthy = |v: Option<&str>| match v.map(|v| v.to_ascii_lowercase()) {
            None => true,
            Some(v) => matches!(v.as_str(), "true" | "yes" | "on" | "1"),
        };
        match key {
            "core.autocrlf" => {
                self.autocrlf = match value.map(|v| v.to_ascii_lowercase()) {
                    Some(v) if v == "input" => AutoCrlf::Input,
                    v if truthy(v.as_deref()) => AutoCrlf::True,
                    _ => AutoCrlf::False,
                }
            }
            "core.eol" => {
                self.eol = match value.map(|v| v.to_ascii_lowercase()).as_deref() {
                    Some("crlf") => Eol::Crlf,
                    Some("lf") | Some("native") => Eol::Lf,
                    _ => Eol::Unset,
                }
            }
            _ => {
                let Some(rest) = key.strip_prefix("filter.") else {
                    return;
                };
                let Some((name, var)) = rest.rsplit_once('.') else {
                    return;
                };
                let d = self.drivers.entry(name.to_string()).or_default();
                let v = value.map(str::to_string);
                match var {
                    "smudge" => d.smudge = v,
                    "clean" => d.clean = v,
                    "process" => d.process = v,
                    "required" => d.required = truthy(value),
                    _ => {}
                }
            }
        }
    }

    /// git's `text_eol_is_crlf`.
    pub fn text_eol_is_crlf(&self) -> bool {
        match self.autocrlf {
            AutoCrlf::True => true,
            AutoCrlf::Input => false,
            AutoCrlf::False => self.eol == Eol::Crlf,
        }
    }

    /// Whether nothing here can make a checkout convert (with attributes that never
    /// mention a conversion).
    pub fn is_plain(&self) -> bool {
        self.autocrlf == AutoCrlf::False && self.eol != Eol::Crlf && self.drivers.is_empty()
    }

    /// A short description, for the cache key of what was decided with it.
    pub fn describe(&self) -> String {
        let mut s = format!("autocrlf={:?};eol={:?}", self.autocrlf, self.eol);
        for (name, d) in &self.drivers {
            s.push_str(&format!(
                ";filter.{name}={:?}/{:?}/{:?}/{}",
                d.smudge, d.clean, d.process, d.required
            ));
        }
        s
    }
}

/// One attribute's state, as `git check-attr` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AttrValue {
    #[default]
    Unspecified,
    Set,
    Unset,
    Value(String),
}

impl AttrValue {
    pub fn parse(s: &str) -> AttrValue {
        match s {
            "unspecified" => AttrValue::Unspecified,
            "set" => AttrValue::Set,
            "unset" => AttrValue::Unset,
            v => AttrValue::Value(v.to_string()),
        }
    }
}

/// The attributes git's conversions read, for one path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathAttrs {
    pub text: AttrValue,
    pub eol: AttrValue,
    pub crlf: AttrValue,
    pub ident: AttrValue,
    pub filter: AttrValue,
    pub encoding: AttrValue,
}

/// The attribute names, in the order `PathAttrs::set` takes them.
pub const ATTR_NAMES: [&str; 6] = [
    "text",
    "eol",
    "crlf",
    "ident",
    "filter",
    "working-tree-encoding",
];

impl PathAttrs {
    pub fn set(&mut self, name: &str, value: AttrValue) {
        match name {
            "text" => self.text = value,
            "eol" => self.eol = value,
            "crlf" => self.crlf = value,
            "ident" => self.ident = value,
            "filter" => self.filter = value,
            "working-tree-encoding" => self.encoding = value,
            _ => {}
        }
    }
}

/// What a checkout does to one path's blob (only paths where it may change something).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv {
    /// The end-of-line rule after git's decisions.
    pub crlf: CrlfAction,
    /// Whether line ends are written as CRLF (git's `output_eol` is CRLF).
    pub crlf_out: bool,
    pub ident: bool,
    /// A configured filter driver's name.
    pub filter: Option<String>,
    pub required: bool,
    pub encoding: Option<String>,
    /// For an LFS pointer under the `lfs` filter and no other conversion: the size of the
    /// file it stands for.
    pub lfs_size: Option<u64>,
}

fn crlf_of(v: &AttrValue) -> CrlfAction {
    match v {
        AttrValue::Set => CrlfAction::Text,
        AttrValue::Unset => CrlfAction::Binary,
        AttrValue::Unspecified => CrlfAction::Undefined,
        AttrValue::Value(s) if s == "input" => CrlfAction::TextInput,
        AttrValue::Value(s) if s == "auto" => CrlfAction::Auto,
        AttrValue::Value(_) => CrlfAction::Undefined,
    }
}

fn is_utf8(name: &str) -> bool {
    name.eq_ignore_ascii_case("utf-8") || name.eq_ignore_ascii_case("utf8")
}

/// git's `convert_attrs` and the decisions after it: what a checkout does to a file with
/// these attributes, or None when it writes the blob as it is.
pub fn classify(a: &PathAttrs, cfg: &ConvConfig) -> Option<Conv> {
    let mut crlf = crlf_of(&a.text);
    if crlf == CrlfAction::Undefined {
        crlf = crlf_of(&a.crlf);
    }
    let ident = a.ident == AttrValue::Set;
    let filter = match &a.filter {
        AttrValue::Value(name) if cfg.drivers.contains_key(name) => Some(name.clone()),
        _ => None,
    };
    if crlf != CrlfAction::Binary {
        let eol = match &a.eol {
            AttrValue::Value(s) if s == "lf" => Eol::Lf,
            AttrValue::Value(s) if s == "crlf" => Eol::Crlf,
            _ => Eol::Unset,
        };
        crlf = match (crlf, eol) {
            (CrlfAction::Auto, Eol::Lf) => CrlfAction::AutoInput,
            (CrlfAction::Auto, Eol::Crlf) => CrlfAction::AutoCrlf,
            (_, Eol::Lf) => CrlfAction::TextInput,
            (_, Eol::Crlf) => CrlfAction::TextCrlf,
            (c, Eol::Unset) => c,
        };
    }
    let encoding = match &a.encoding {
        AttrValue::Value(v) if !v.is_empty() && !is_utf8(v) => Some(v.clone()),
        _ => None,
    };
    if crlf == CrlfAction::Text {
        crlf = if cfg.text_eol_is_crlf() {
            CrlfAction::TextCrlf
        } else {
            CrlfAction::TextInput
        };
    }
    if crlf == CrlfAction::Undefined {
        crlf = match cfg.autocrlf {
            AutoCrlf::False => CrlfAction::Binary,
            AutoCrlf::True => CrlfAction::AutoCrlf,
            AutoCrlf::Input => CrlfAction::AutoInput,
        };
    }
    let crlf_out = match crlf {
        CrlfAction::Binary | CrlfAction::TextInput | CrlfAction::AutoInput => false,
        CrlfAction::TextCrlf | CrlfAction::AutoCrlf | CrlfAction::Undefined => true,
        CrlfAction::Text | CrlfAction::Auto => cfg.text_eol_is_crlf(),
    };
    let required = filter
        .as_ref()
        .and_then(|f| cfg.drivers.get(f))
        .is_some_and(|d| d.required);
    (crlf_out || ident || filter.is_some() || encoding.is_some()).then_some(Conv {
        crlf,
        crlf_out,
        ident,
        filter,
        required,
        encoding,
        lfs_size: None,
    })
}

impl Conv {
    /// Whether git itself must convert (a filter or an encoding: programs and iconv).
    pub fn runs_git(&self) -> bool {
        self.filter.is_some() || self.encoding.is_some()
    }

    /// Whether a checkout streams the blob (git's `CA_CLASS_STREAMABLE`).
    pub fn streamable(&self) -> bool {
        !self.runs_git() && !matches!(self.crlf, CrlfAction::Auto | CrlfAction::AutoCrlf)
    }

    /// One line of text that says it all, without NUL or newline (`parse` reads it back).
    pub fn encode(&self) -> String {
        let mut parts = vec![format!("crlf={}", self.crlf.name())];
        if self.crlf_out {
            parts.push("out=crlf".into());
        }
        if self.ident {
            parts.push("ident".into());
        }
        if let Some(f) = &self.filter {
            parts.push(format!("filter={}", escape(f)));
        }
        if self.required {
            parts.push("required".into());
        }
        if let Some(e) = &self.encoding {
            parts.push(format!("enc={}", escape(e)));
        }
        if let Some(n) = self.lfs_size {
            parts.push(format!("lfs={n}"));
        }
        parts.join(" ")
    }

    pub fn parse(s: &str) -> Option<Conv> {
        let mut c = Conv {
            crlf: CrlfAction::Binary,
            crlf_out: false,
            ident: false,
            filter: None,
            required: false,
            encoding: None,
            lfs_size: None,
        };
        for part in s.split(' ') {
            match part.split_once('=') {
                Some(("crlf", v)) => c.crlf = CrlfAction::from_name(v)?,
                Some(("out", "crlf")) => c.crlf_out = true,
                Some(("filter", v)) => c.filter = Some(unescape(v)?),
                Some(("enc", v)) => c.encoding = Some(unescape(v)?),
                Some(("lfs", v)) => c.lfs_size = Some(v.parse().ok()?),
                None if part == "ident" => c.ident = true,
                None if part == "required" => c.required = true,
                _ => return None,
            }
        }
        Some(c)
    }

    /// The conversion done here (no filter, no encoding): what a checkout writes for the
    /// blob `oid` holding `blob`.
    pub fn apply(&self, oid: Oid, blob: &[u8]) -> Vec<u8> {
        debug_assert!(!self.runs_git());
        if self.streamable() {
            let out = if self.ident {
                ident_stream(blob, oid)
            } else {
                blob.to_vec()
            };
            if self.crlf_out {
                lf_to_crlf(&out)
            } else {
                out
            }
        } else {
            let out = ident_in_core(blob, oid, self.ident);
            let src = out.as_deref().unwrap_or(blob);
            crlf_in_core(src, self.crlf, self.crlf_out).unwrap_or_else(|| src.to_vec())
        }
    }
}

fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_graphic() && b != b'%' && b != b'=' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// git's `struct text_stat`.
#[derive(Default)]
struct TextStat {
    nul: u32,
    lonecr: u32,
    lonelf: u32,
    crlf: u32,
    printable: u32,
    nonprintable: i64,
}

fn gather_stats(buf: &[u8]) -> TextStat {
    let mut s = TextStat::default();
    let mut i = 0;
    while i < buf.len() {
        let c = buf[i];
        if c == b'\r' {
            if buf.get(i + 1) == Some(&b'\n') {
                s.crlf += 1;
                i += 1;
            } else {
                s.lonecr += 1;
            }
        } else if c == b'\n' {
            s.lonelf += 1;
        } else if c == 127 {
            s.nonprintable += 1;
        } else if c < 32 {
            match c {
                b'\x08' | b'\t' | b'\x1b' | b'\x0c' => s.printable += 1,
                0 => {
                    s.nul += 1;
                    s.nonprintable += 1;
                }
                _ => s.nonprintable += 1,
            }
        } else {
            s.printable += 1;
        }
        i += 1;
    }
    if buf.last() == Some(&b'\x1a') {
        s.nonprintable -= 1;
    }
    s
}

fn is_binary(s: &TextStat) -> bool {
    s.lonecr > 0 || s.nul > 0 || ((s.printable >> 7) as i64) < s.nonprintable
}

/// git's `crlf_to_worktree`: None when it leaves the content alone.
fn crlf_in_core(src: &[u8], action: CrlfAction, crlf_out: bool) -> Option<Vec<u8>> {
    if src.is_empty() || !crlf_out {
        return None;
    }
    let stats = gather_stats(src);
    // will_convert_lf_to_crlf
    if stats.lonelf == 0 {
        return None;
    }
    if action.is_auto() && (stats.lonecr > 0 || stats.crlf > 0 || is_binary(&stats)) {
        return None;
    }
    Some(lf_to_crlf(src))
}

/// Every LF not preceded by CR becomes CRLF (git's `lf_to_crlf` stream filter, and the
/// loop of `crlf_to_worktree`).
pub fn lf_to_crlf(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() + src.len() / 16);
    let mut prev = 0u8;
    for &c in src {
        if c == b'\n' && prev != b'\r' {
            out.push(b'\r');
        }
        out.push(c);
        prev = c;
    }
    out
}

/// git's `count_ident`.
fn count_ident(mut cp: &[u8]) -> usize {
    let mut cnt = 0;
    while let Some((&ch, rest)) = cp.split_first() {
        cp = rest;
        if ch != b'$' {
            continue;
        }
        if cp.len() < 3 {
            break;
        }
        if &cp[..2] != b"Id" {
            continue;
        }
        let ch = cp[2];
        cp = &cp[3..];
        if ch == b'$' {
            cnt += 1;
        }
        if ch != b':' {
            continue;
        }
        while let Some((&ch, rest)) = cp.split_first() {
            cp = rest;
            if ch == b'$' {
                cnt += 1;
                break;
            }
            if ch == b'\n' {
                break;
            }
        }
    }
    cnt
}

/// git's `ident_to_worktree` (the in-memory conversion): None when it changes nothing.
fn ident_in_core(src: &[u8], oid: Oid, ident: bool) -> Option<Vec<u8>> {
    if !ident {
        return None;
    }
    let cnt = count_ident(src);
    if cnt == 0 {
        return None;
    }
    let hex = oid.to_string();
    let mut out = Vec::with_capacity(src.len() + cnt * (hex.len() + 3));
    let mut src = src;
    while let Some(d) = src.iter().position(|&c| c == b'$') {
        out.extend_from_slice(&src[..=d]);
        src = &src[d + 1..];
        if src.len() < 3 || &src[..2] != b"Id" {
            continue;
        }
        if src[2] == b'$' {
            src = &src[3..];
        } else if src[2] == b':' {
            let Some(d) = src[3..].iter().position(|&c| c == b'$').map(|p| p + 3) else {
                break;
            };
            if src[3..d].contains(&b'\n') {
                continue;
            }
            // A space before the one ahead of the dollar: another system's id, kept.
            let space = (d > 4)
                .then(|| src[4..d].iter().position(|&c| c == b' '))
                .flatten();
            if space.is_some_and(|p| p + 4 < d - 1) {
                continue;
            }
            src = &src[d + 1..];
        } else {
            continue;
        }
        out.extend_from_slice(b"Id: ");
        out.extend_from_slice(hex.as_bytes());
        out.extend_from_slice(b" $");
    }
    out.extend_from_slice(src);
    Some(out)
}

/// git's `is_foreign_ident`, on the held text (a C string: up to its first NUL).
fn is_foreign_ident(held: &[u8]) -> bool {
    let s = match held.iter().position(|&c| c == 0) {
        Some(n) => &held[..n],
        None => held,
    };
    let Some(rest) = s.strip_prefix(b"$Id: ") else {
        return false;
    };
    (0..rest.len()).any(|i| {
        matches!(rest[i], b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
            && rest.get(i + 1) != Some(&b'$')
    })
}

/// git's `ident` stream filter (what a checkout that streams writes).
fn ident_stream(input: &[u8], oid: Oid) -> Vec<u8> {
    const HEAD: &[u8; 4] = b"$Id\0";
    const DRAINING: i32 = -1;
    const SKIPPING: i32 = -2;
    let ident = format!(": {oid} $");
    let mut out = Vec::with_capacity(input.len());
    let mut left: Vec<u8> = Vec::new();
    let mut state: i32 = 0;
    for &ch in input {
        if state == DRAINING {
            out.append(&mut left);
            state = 0;
        }
        if state == SKIPPING {
            left.push(ch);
            if ch != b'\n' && ch != b'$' {
                continue;
            }
            if ch == b'$' && !is_foreign_ident(&left) {
                left.truncate(HEAD.len() - 1);
                left.extend_from_slice(ident.as_bytes());
            }
            state = DRAINING;
            continue;
        }
        if (state as usize) < HEAD.len() && HEAD[state as usize] == ch {
            state += 1;
            continue;
        }
        if state > 0 {
            left.extend_from_slice(&HEAD[..state as usize]);
        }
        if state == HEAD.len() as i32 - 1 {
            if ch != b':' && ch != b'$' {
                left.push(ch);
                state = 0;
                continue;
            }
            if ch == b':' {
                left.push(ch);
                state = SKIPPING;
            } else {
                left.extend_from_slice(ident.as_bytes());
                state = DRAINING;
            }
            continue;
        }
        left.push(ch);
        state = DRAINING;
    }
    if state > 0 {
        left.extend_from_slice(&HEAD[..state as usize]);
    }
    out.append(&mut left);
    out
}

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
fn ident_to_git(src: &[u8]) -> Vec<u8> {
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
fn any_set_attribute(text: &[u8], pred: impl Fn(&str, Option<&str>) -> bool) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
