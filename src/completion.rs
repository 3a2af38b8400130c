//! Shell completion of repository and worktree names: clap writes the completion of
//! commands and options; what is appended here completes a command's REPO/WT (or REPO)
//! from the state directory, through the hidden `worktreefs __names KIND`.

use std::path::Path;

use worktreefs::lease::State;
use worktreefs::store::Store;

/// What `__names` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Names {
    /// REPO/WT of every worktree that is not removed.
    Worktrees,
    /// REPO/WT of every removed worktree still restorable.
    Removed,
    /// Every registered repository.
    Repos,
}

/// Prints the names of `kind` in state directory `root`, one a line; nothing (and no
/// state directory made) when there is none.
pub fn print_names(root: &Path, kind: Names) {
    if !root.join(worktreefs::store::DB_FILE).is_file() {
        return;
    }
    let Ok(store) = Store::open(root) else { return };
    let names: Vec<String> = match kind {
        Names::Worktrees => store
            .worktrees()
            .unwrap_or_default()
            .into_iter()
            .filter(|w| w.state != State::Removed)
            .map(|w| format!("{}/{}", w.repo, w.name))
            .collect(),
        Names::Removed => store
            .kept()
            .unwrap_or_default()
            .into_iter()
            .map(|k| format!("{}/{}", k.repo, k.worktree))
            .collect(),
        Names::Repos => store
            .repos()
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.name)
            .collect(),
    };
    for n in names {
        println!("{n}");
    }
}

/// The completion script for `shell`: clap's, with the completion of names added (for
/// zsh, the function that offers them takes the place of clap's as the one `compdef`
/// names, and hands every other word to clap's).
pub fn script(shell: clap_complete::Shell, clap_script: String) -> String {
    match shell {
        clap_complete::Shell::Bash => clap_script + BASH,
        clap_complete::Shell::Fish => clap_script + FISH,
        clap_complete::Shell::Zsh => match clap_script.rfind(ZSH_CLAP_TAIL) {
            Some(at) => format!("{}{ZSH}", &clap_script[..at]),
            // clap wrote its script otherwise: its own completion still works.
            None => clap_script,
        },
        _ => clap_script,
    }
}

const BASH: &str = r#"
# Repository and worktree names, from the state directory (--state-dir when given).
_worktreefs_names() {
    local sd=() i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
            --state-dir) sd=(--state-dir "${COMP_WORDS[i+1]}") ;;
            --state-dir=*) sd=("${COMP_WORDS[i]}") ;;
        esac
    done
    command worktreefs "${sd[@]}" __names "$1" 2>/dev/null
}
_worktreefs_with_names() {
    _worktreefs "$@"
    local cur=${COMP_WORDS[COMP_CWORD]} words=() i kind=
    [[ $cur == -* ]] && return
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
            --state-dir|--log-level|--session|--wait|--timeout|--base|--branch|--from|--as|--id|--reason|--report) ((i++)) ;;
            -*) ;;
            *) words+=("${COMP_WORDS[i]}") ;;
        esac
    done
    case "${words[*]}" in
        reclaim|run|turn|du|"lease acquire"|"lease release"|"turns end") kind=worktrees ;;
        restore) kind=removed ;;
        new|warm|"repo set"|"repo remove") kind=repos ;;
        *) return ;;
    esac
    local names
    names=$(_worktreefs_names "$kind")
    if [[ ${words[0]} == new ]]; then
        names=$(printf '%s/\n' $names)
        compopt -o nospace 2>/dev/null
    fi
    COMPREPLY=($(compgen -W "$names" -- "$cur"))
}
complete -F _worktreefs_with_names -o bashdefault -o default worktreefs
"#;

const FISH: &str = r#"
# Repository and worktree names, from the state directory.
complete -c worktreefs -f -n '__fish_seen_subcommand_from reclaim run turn du acquire release end' -a '(worktreefs __names worktrees 2>/dev/null)'
complete -c worktreefs -f -n '__fish_seen_subcommand_from restore' -a '(worktreefs __names removed 2>/dev/null)'
complete -c worktreefs -f -n '__fish_seen_subcommand_from new warm set remove' -a '(worktreefs __names repos 2>/dev/null)'
"#;

/// How clap's zsh script ends: it runs its function when loaded from `fpath` (as
/// `_worktreefs`), else registers it.
const ZSH_CLAP_TAIL: &str = r#"if [ "$funcstack[1]" = "_worktreefs" ]; then
    _worktreefs "$@"
else
    compdef _worktreefs worktreefs
fi
"#;

/// Replaces [`ZSH_CLAP_TAIL`]: `_worktreefs_with_names` offers names where a command takes
/// REPO/WT (or REPO) and hands everything else to clap's `_worktreefs`. Loaded from
/// `fpath`, the file runs as `_worktreefs` once; it then registers the wrapper, so later
/// completions do not go to clap's function directly.
const ZSH: &str = r#"# Repository and worktree names, from the state directory (--state-dir when given).
_worktreefs_names() {
    local -a sd
    local i
    for ((i = 2; i < CURRENT; i++)); do
        case ${words[i]} in
            --state-dir) sd=(--state-dir "${words[i+1]}") ;;
            --state-dir=*) sd=("${words[i]}") ;;
        esac
    done
    command worktreefs "${sd[@]}" __names "$1" 2>/dev/null
}
_worktreefs_with_names() {
    local cur=${words[CURRENT]} kind= i
    local -a plain names
    if [[ $cur != -* ]]; then
        for ((i = 2; i < CURRENT; i++)); do
            case ${words[i]} in
                --state-dir|--log-level|--session|--wait|--timeout|--base|--branch|--from|--as|--id|--reason|--report) ((i++)) ;;
                -*) ;;
                *) plain+=("${words[i]}") ;;
            esac
        done
        case "${plain[*]}" in
            reclaim|run|turn|du|"lease acquire"|"lease release"|"turns end") kind=worktrees ;;
            restore) kind=removed ;;
            new|warm|"repo set"|"repo remove") kind=repos ;;
        esac
    fi
    if [[ -z $kind ]]; then
        _worktreefs "$@"
        return
    fi
    names=(${(f)"$(_worktreefs_names $kind)"})
    if [[ ${plain[1]} == new ]]; then
        compadd -S / -- "${names[@]}"
    else
        compadd -- "${names[@]}"
    fi
}
if [ "$funcstack[1]" = "_worktreefs" ]; then
    compdef _worktreefs_with_names worktreefs
    _worktreefs_with_names "$@"
else
    compdef _worktreefs_with_names worktreefs
fi
"#;
