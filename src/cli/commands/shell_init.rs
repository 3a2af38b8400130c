//! `worktreefs shell-init SHELL`: a shell function that goes into a worktree in one step,
//! making it first when it does not exist (`eval "$(worktreefs shell-init bash)"` in the
//! shell's startup file). The function runs `new --print-path --reuse` and `cd`s into the
//! path it prints; the program cannot change its caller's directory itself.

use std::path::Path;

use anyhow::bail;
use clap::{Args, ValueEnum};

use crate::cli::exit::Failed;
use crate::cli::output::invocation_with;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args)]
pub struct ShellInitArgs {
    /// bash, zsh or fish.
    pub shell: Shell,
    /// The function's name.
    #[arg(long, default_value = "wtcd")]
    pub name: String,
}

/// Prints the function for the state directory at `root` (named in it, as an absolute
/// path, unless it is the default one).
pub fn run(root: &Path, args: ShellInitArgs) -> Result<(), Failed> {
    let root = std::path::absolute(root)
        .map_err(|e| anyhow::anyhow!("the state dir {}: {e}", root.display()))?;
    print!(
        "{}",
        script(args.shell, &args.name, &invocation_with(&root, false))?
    );
    Ok(())
}

/// Names a function of its own must not take: the words it runs, and the shells'
/// reserved words and builtins it would hide.
const TAKEN: &[&str] = &[
    "command",
    "local",
    "cd",
    "set",
    "or",
    "and",
    "not",
    "return",
    "function",
    "end",
    "begin",
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "for",
    "while",
    "until",
    "do",
    "done",
    "case",
    "esac",
    "in",
    "select",
    "time",
    "builtin",
    "exec",
    "eval",
    "source",
    "test",
    "echo",
    "printf",
    "read",
    "exit",
    "export",
    "unset",
    "alias",
    "type",
    "trap",
    "wait",
    "kill",
    "true",
    "false",
    "worktreefs",
];

/// The function `name` for `shell`, running the program as `me`.
fn script(shell: Shell, name: &str, me: &str) -> anyhow::Result<String> {
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if TAKEN.contains(&name) {
        bail!(
            "'{name}' is a word the shell or the function itself uses: pick another name (for example --name wtcd)"
        );
    }
    // fish reads `\` and `\'` inside single quotes: a path quoted for sh is not one for it.
    if shell == Shell::Fish && me.contains('\\') {
        bail!(
            "the program or state dir path has a backslash, which fish would read differently: `{me}`; run shell-init from a path without one"
        );
    }
    if !valid {
        bail!(
            "'{name}' cannot name a shell function: use letters, digits, '_' and '-', starting with a letter or '_' (for example --name wtcd)"
        );
    }
    let about = format!(
        "`{name} REPO/NAME [new's options]` goes into worktree REPO/NAME of worktreefs, making it first when it does not exist"
    );
    Ok(match shell {
        Shell::Bash | Shell::Zsh => format!(
            "# {about}.\n\
             {name}() {{\n\
             \x20   local dir\n\
             \x20   dir=\"$(command {me} new --print-path --reuse \"$@\")\" || return\n\
             \x20   cd -- \"$dir\"\n\
             }}\n"
        ),
        Shell::Fish => format!(
            "# {about}.\n\
             function {name} --description 'Go into a worktreefs worktree, making it first when it does not exist'\n\
             \x20   set -l dir (command {me} new --print-path --reuse $argv); or return\n\
             \x20   cd $dir\n\
             end\n"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The function runs `new --print-path --reuse` and nothing but a name that is a
    /// shell word is taken.
    #[test]
    fn the_function_calls_new_and_takes_only_a_plain_name() {
        let s = script(Shell::Bash, "go", "worktreefs").unwrap();
        assert!(s.contains("go() {"), "{s}");
        assert!(
            s.contains("command worktreefs new --print-path --reuse \"$@\""),
            "{s}"
        );
        let f = script(Shell::Fish, "go", "/opt/x/worktreefs --state-dir /s").unwrap();
        assert!(f.starts_with("# ") && f.contains("function go "), "{f}");
        assert!(
            f.contains("command /opt/x/worktreefs --state-dir /s new"),
            "{f}"
        );
        for bad in [
            "", "1go", "go;rm", "go now", "$(x)", "cd", "command", "set", "if",
        ] {
            assert!(script(Shell::Zsh, bad, "worktreefs").is_err(), "{bad:?}");
        }
    }
}
