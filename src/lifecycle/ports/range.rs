//! The range blocks of ports are cut from (`mount --ports LOW-HIGH`, `--port-block`),
//! and where the last mount recorded it.

use crate::store::{PortBlock, Store};

/// Where blocks are cut from, and how big each is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
    pub block: u16,
}

impl Default for PortRange {
    fn default() -> PortRange {
        PortRange {
            low: 20000,
            high: 29999,
            block: 10,
        }
    }
}

/// Where the mount records its range (`LOW-HIGH/BLOCK`), for creations made by any
/// process of the state directory.
pub const META_RANGE: &str = "port_range";

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}/{}", self.low, self.high, self.block)
    }
}

/// The range the last mount of the state directory set, else the default.
pub fn range_of(store: &Store) -> PortRange {
    store
        .meta_get(META_RANGE)
        .ok()
        .flatten()
        .and_then(|v| {
            let (range, block) = v.split_once('/')?;
            PortRange::parse(range, block.parse().ok()?).ok()
        })
        .unwrap_or_default()
}

impl PortRange {
    /// `LOW-HIGH` (`mount --ports`), with blocks of `block`: refused, saying why, when
    /// it holds no block or reaches port 0.
    pub fn parse(text: &str, block: u16) -> Result<PortRange, String> {
        let (lo, hi) = text.split_once('-').ok_or_else(|| {
            format!("'{text}' is not a range of ports LOW-HIGH (for example 20000-29999)")
        })?;
        let parse = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("'{s}' in '{text}' is not a port (1-65535)"))
        };
        let (low, high) = (parse(lo)?, parse(hi)?);
        if low == 0 || block == 0 || high < low || (high - low) as u32 + 1 < block as u32 {
            return Err(format!(
                "ports {text} hold no block of {block}: give LOW-HIGH with LOW at least 1 and at least {block} ports"
            ));
        }
        Ok(PortRange { low, high, block })
    }

    /// Its blocks, in order.
    pub(super) fn blocks(&self) -> impl Iterator<Item = PortBlock> + '_ {
        (self.low as u32..)
            .step_by(self.block as usize)
            .take_while(|f| f + self.block as u32 - 1 <= self.high as u32)
            .map(|f| PortBlock {
                first: f as u16,
                size: self.block,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_that_holds_no_block_is_refused() {
        assert!(PortRange::parse("20000-29999", 10).is_ok());
        for bad in ["", "20000", "x-y", "0-100", "300-200", "20000-20004"] {
            assert!(PortRange::parse(bad, 10).is_err(), "{bad}");
        }
    }
}
