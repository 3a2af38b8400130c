//! The conversions that need no program: LF to CRLF (with git's "safer autocrlf"
//! statistics) and `ident`, in memory and streamed.

use git2::Oid;

use super::config::*;

/// git's `struct text_stat`.
#[derive(Default)]
pub(super) struct TextStat {
    nul: u32,
    lonecr: u32,
    lonelf: u32,
    crlf: u32,
    printable: u32,
    nonprintable: i64,
}

pub(super) fn gather_stats(buf: &[u8]) -> TextStat {
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

pub(super) fn is_binary(s: &TextStat) -> bool {
    s.lonecr > 0 || s.nul > 0 || ((s.printable >> 7) as i64) < s.nonprintable
}

/// git's `crlf_to_worktree`: None when it leaves the content alone.
pub(super) fn crlf_in_core(src: &[u8], action: CrlfAction, crlf_out: bool) -> Option<Vec<u8>> {
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
pub(super) fn count_ident(mut cp: &[u8]) -> usize {
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
pub(super) fn ident_in_core(src: &[u8], oid: Oid, ident: bool) -> Option<Vec<u8>> {
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
pub(super) fn is_foreign_ident(held: &[u8]) -> bool {
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
pub(super) fn ident_stream(input: &[u8], oid: Oid) -> Vec<u8> {
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
