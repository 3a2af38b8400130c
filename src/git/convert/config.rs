//! What decides a conversion: git's end-of-line settings (`core.autocrlf`, `core.eol`),
//! filter drivers, and a path's attributes.

use std::collections::BTreeMap;

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
    pub(super) fn name(self) -> &'static str {
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

    pub(super) fn from_name(s: &str) -> Option<CrlfAction> {
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

    pub(super) fn is_auto(self) -> bool {
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
