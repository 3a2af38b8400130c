//! What a checkout does to one path's blob (`Conv`), decided from its attributes and the
//! settings, and done in memory or as a stream.

use git2::Oid;

use super::config::*;
use super::text::*;

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

pub(super) fn crlf_of(v: &AttrValue) -> CrlfAction {
    match v {
        AttrValue::Set => CrlfAction::Text,
        AttrValue::Unset => CrlfAction::Binary,
        AttrValue::Unspecified => CrlfAction::Undefined,
        AttrValue::Value(s) if s == "input" => CrlfAction::TextInput,
        AttrValue::Value(s) if s == "auto" => CrlfAction::Auto,
        AttrValue::Value(_) => CrlfAction::Undefined,
    }
}

pub(super) fn is_utf8(name: &str) -> bool {
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

pub(super) fn escape(s: &str) -> String {
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

pub(super) fn unescape(s: &str) -> Option<String> {
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
