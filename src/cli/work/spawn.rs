//! Starting a handler: its environment, its own process group, and its death with the
//! worker's; killing its group.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

use super::Shared;

/// The handler command, with its environment, in a process group of its own (a Ctrl-C
/// at the terminal stops the worker's claiming, not the commands it lets finish; a
/// timeout kills the whole group), and killed if the worker dies (Linux).
pub(super) fn command(sh: &Shared) -> Command {
    let args = &sh.args;
    let (program, rest) = args.command.split_first().expect("clap requires COMMAND");
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env("PRECEDENT_QUEUE", &args.queue)
        .process_group(0);
    // A worker of a remote hub has no database to name.
    if let Some(db) = &sh.db {
        cmd.env("PRECEDENT_DB", db);
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(2) and getppid(2) are async-signal-safe and touch no memory of
        // the parent; nothing here allocates.
        let parent = std::process::id() as libc::pid_t;
        unsafe {
            cmd.pre_exec(move || {
                // IMPORTANT: the signal comes when the *thread* that spawned the child
                // ends; each job spawns its handlers from its own thread, which outlives
                // them.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    // The worker died before the prctl took effect.
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Kills the process group led by `pid` (a child started by [`command`], so in a group
/// of its own, not reaped yet).
pub(super) fn kill_group(pid: u32) {
    // SAFETY: kill(2) has no memory effects; the group is that of a child of ours that
    // has not been reaped, so its id is not reused.
    unsafe {
        libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
    }
}

/// How a handler's process ended, in words.
pub(super) fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".into(),
    }
}
