//! How a command ends: its exit code and, when JSON was asked for, its failure as JSON.
//!
//! A command returns `Result<(), Failed>`. A [`Failed`] holds what ended the command as
//! a `dyn` [`Exit`], and that trait says how it ends: the exit code, the sentence people
//! get, and what it prints as JSON (a typed refusal its own object, any other failure
//! the failure object, or nothing when what failed was printed already). Each error type
//! a command meets implements it: `report::Refusal` (its code and its JSON), `RunError`
//! (a shell's 127 or 126 for a command that could not be started), and the failures of
//! each layer (`anyhow::Error`, `StoreError`, `io::Error`, …: exit 1, the failure
//! object). So `?` turns any of them into a `Failed`, and `finish` asks the trait: no
//! caller looks inside an error to tell what it was. Where the JSON goes is the command
//! line's to say ([`JsonTo`], from `--json`), not the error's.

use std::fmt;
use std::process::ExitCode;

use worktreefs::process::supervise::{exit_code, RunError};
use worktreefs::report;
use worktreefs::report::shapes::FailedJson;

use crate::cli::report_file::{write_report, REPORT};

/// The exit codes, as `--help` ends with them (and the README gives them).
pub const EXIT_CODES: &str = "Exit codes: 0 success; 1 the request could not be carried out (the message names the thing, its state and the way out); 2 bad usage; 3 a typed conflict: the worktree cannot be had now (lease acquire, run, turn: somebody else holds it, another turn runs there, processes outside a guarded turn write there, or it is deleting, removed or unknown). run and turn otherwise exit with their command's status (127 not found, 126 not executable, 128+N ended by signal N); 124 a turn's command ran past turn --timeout and was ended.";

/// How a failure ends the command it ended.
pub trait Exit: Send + Sync {
    /// The exit code ([`EXIT_CODES`]): 1 unless the failure says otherwise.
    fn exit_code(&self) -> u8 {
        report::EXIT_FAILED
    }

    /// The sentence people get on stderr, with its causes after it.
    fn message(&self) -> String;

    /// What it prints when JSON was asked for.
    fn json(&self) -> AsJson {
        AsJson::Failure
    }

    /// Whether it was said already (a command's own status): then nothing more is
    /// printed, nor written into a turn's report.
    fn said_already(&self) -> bool {
        false
    }
}

/// What a failure prints as JSON.
pub enum AsJson {
    /// The failure object, `{"error": "failed", "message": …}`, with the message.
    Failure,
    /// A typed refusal's own object.
    Refusal(serde_json::Value),
    /// Nothing: what failed was printed already (`doctor --json`'s checks).
    Printed,
}

/// Where a failure's JSON goes: stdout for a command whose output is ours, stderr for one
/// whose stdout is its command's (`run`, `turn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonTo {
    Stdout,
    Stderr,
}

/// What ended a command that failed.
pub struct Failed(Box<dyn Exit>);

impl<E: Exit + 'static> From<E> for Failed {
    fn from(e: E) -> Failed {
        Failed(Box::new(e))
    }
}

impl Failed {
    /// This failure, said after `what` (as anyhow's context is), ending as it would.
    pub fn within(self, what: impl fmt::Display) -> Failed {
        Within {
            what: what.to_string(),
            failed: self,
        }
        .into()
    }
}

impl fmt::Debug for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message())
    }
}

/// A failure said after what was being done.
struct Within {
    what: String,
    failed: Failed,
}

impl Exit for Within {
    fn exit_code(&self) -> u8 {
        self.failed.0.exit_code()
    }

    fn message(&self) -> String {
        format!("{}: {}", self.what, self.failed.0.message())
    }

    fn json(&self) -> AsJson {
        self.failed.0.json()
    }

    fn said_already(&self) -> bool {
        self.failed.0.said_already()
    }
}

/// A command that ends with a status of its own, said already: `run` and `turn` with
/// their command's, `turn` past its timeout with 124, `new --wait-setup` and `setup`
/// with the setup's, a teardown runner with its command's.
pub struct Status(u8);

impl Status {
    /// Ending with `code`: 1 where it is no failure's code (0, or beyond 255).
    pub fn of(code: i32) -> Status {
        Status(
            u8::try_from(code)
                .ok()
                .filter(|&c| c != 0)
                .unwrap_or(report::EXIT_FAILED),
        )
    }
}

impl Exit for Status {
    fn exit_code(&self) -> u8 {
        self.0
    }

    fn message(&self) -> String {
        format!("exit status {}", self.0)
    }

    fn json(&self) -> AsJson {
        AsJson::Printed
    }

    fn said_already(&self) -> bool {
        true
    }
}

impl Exit for report::Refusal {
    fn exit_code(&self) -> u8 {
        self.code
    }

    fn message(&self) -> String {
        self.message.clone()
    }

    fn json(&self) -> AsJson {
        AsJson::Refusal(self.json.clone())
    }
}

/// A command that could not be started exits as a shell's would (127, 126).
impl Exit for RunError {
    fn exit_code(&self) -> u8 {
        self.shell_code().unwrap_or(report::EXIT_FAILED)
    }

    fn message(&self) -> String {
        with_causes(self)
    }
}

impl Exit for anyhow::Error {
    fn message(&self) -> String {
        format!("{self:#}")
    }
}

/// The failures of the layers below, which end a command as any failure does (exit 1,
/// the failure object), said as anyhow says an error: it, then each cause after `: `.
macro_rules! plain_failures {
    ($($t:ty),* $(,)?) => {
        $(impl Exit for $t {
            fn message(&self) -> String {
                with_causes(self)
            }
        })*
    };
}

plain_failures!(
    std::io::Error,
    serde_json::Error,
    worktreefs::store::StoreError,
    worktreefs::lifecycle::create::CreateError,
);

/// A layer's failure of its own kinds (`GitError`, `LifecycleError`), as any failure.
impl<K: Copy + fmt::Debug + Send + Sync + 'static> Exit for worktreefs::failure::Failure<K> {
    fn message(&self) -> String {
        with_causes(self)
    }
}

/// `e` and its causes, each after `: `.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// Ends with the command's status: its code, or 128 + the signal that ended it.
pub fn exit_as(status: std::process::ExitStatus) -> Result<(), Failed> {
    match exit_code(status) {
        0 => Ok(()),
        code => Err(Status::of(code).into()),
    }
}

/// The failure object: `{"error": "failed", "message": …}`.
pub fn failure_json(message: &str) -> serde_json::Value {
    report::shapes::value(FailedJson {
        error: "failed".into(),
        message: message.to_string(),
    })
}

/// The exit code of a command that ended with `result`; a failure said on stderr as a
/// sentence, or as JSON where `json_to` says (a typed refusal with its own JSON, any
/// other failure as `failed`), and written into a turn's `--report` file.
pub fn finish(result: Result<(), Failed>, json_to: Option<JsonTo>) -> ExitCode {
    let Err(Failed(failure)) = result else {
        return ExitCode::SUCCESS;
    };
    if failure.said_already() {
        return ExitCode::from(failure.exit_code());
    }
    let message = report::for_people(&failure.message());
    // JSON on stderr (`run --json`) is all stderr says: parseable.
    if json_to != Some(JsonTo::Stderr) {
        tracing::debug!("{}", failure.message());
        eprintln!("worktreefs: {message}");
    }
    let json = match failure.json() {
        AsJson::Failure => Some(failure_json(&message)),
        AsJson::Refusal(v) => Some(v),
        AsJson::Printed => None,
    };
    if REPORT.get().is_some() {
        write_report(&json.clone().unwrap_or_else(|| failure_json(&message)));
    }
    match (json, json_to) {
        (Some(v), Some(JsonTo::Stdout)) => println!("{v:#}"),
        (Some(v), Some(JsonTo::Stderr)) => eprintln!("{v:#}"),
        _ => {}
    }
    ExitCode::from(failure.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of failure ends as its type says, through `Failed` and through `within`.
    #[test]
    fn a_failure_ends_with_the_code_and_json_its_type_gives() {
        let not_found = RunError::Spawn {
            program: "nosuch".into(),
            error: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let f = Failed::from(not_found).within("in /m/r/w (state ready)");
        assert_eq!(f.0.exit_code(), 127);
        assert!(
            f.0.message()
                .starts_with("in /m/r/w (state ready): starting nosuch"),
            "{f:?}"
        );
        assert!(matches!(f.0.json(), AsJson::Failure));

        let refusal = report::Refusal {
            message: "worktree 'r/w' is busy".into(),
            json: failure_json("stands for a refusal's own"),
            code: report::EXIT_CONFLICT,
        };
        let f = Failed::from(refusal).within("never shown in its JSON");
        assert_eq!(f.0.exit_code(), 3);
        match f.0.json() {
            AsJson::Refusal(v) => assert_eq!(v, failure_json("stands for a refusal's own")),
            _ => panic!("a refusal prints its own JSON"),
        }

        // Any other failure: exit 1, said as anyhow says it, causes and all.
        let io = || std::io::Error::other("disk on fire");
        let chained = anyhow::Error::from(io()).context("writing the index");
        let said = format!("{chained:#}");
        let f = Failed::from(chained);
        assert_eq!((f.0.exit_code(), f.0.message()), (1, said));
        assert_eq!(
            Failed::from(io()).0.message(),
            format!("{:#}", anyhow::Error::from(io()))
        );
    }

    /// A command's own status ends the command with that code and nothing more said,
    /// wrapped or not; a code no exit can carry ends it with 1.
    #[test]
    fn a_status_of_its_own_ends_with_its_code_and_says_nothing_more() {
        for (code, ends) in [(7, 7), (124, 124), (255, 255), (0, 1), (256, 1), (-1, 1)] {
            let f = Failed::from(Status::of(code));
            assert_eq!((f.0.exit_code(), f.0.said_already()), (ends, true));
            assert!(matches!(f.0.json(), AsJson::Printed));
            let f = f.within("in /m/r/w");
            assert_eq!((f.0.exit_code(), f.0.said_already()), (ends, true));
        }
        assert_eq!(finish(Err(Status::of(9).into()), None), ExitCode::from(9));
        assert!(!Failed::from(std::io::Error::other("x")).0.said_already());
    }
}
