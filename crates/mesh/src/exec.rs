//! `ambit exec POD -- CMD`: a command inside a pod's network namespace with the pod's
//! container environment — the host's filesystem, the pod's network (so its traffic is
//! captured like the pod's own). A VM (`kind: VirtualMachine`) is reached the same way, by
//! its name: the command runs in the VM's namespace with the VM command's environment.

use std::process::Command;

use ambit_netns::{NetnsFd, set_command_netns};

use crate::state::{RunDir, StateError};

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("no mesh is recorded in {0}")]
    NoMesh(std::path::PathBuf),
    #[error(
        "no pod {pod:?} (known: {known}); use NAMESPACE/NAME when a name is in several namespaces"
    )]
    UnknownPod { pod: String, known: String },
    #[error("no command given")]
    NoCommand,
    #[error("entering the pod's namespace: {0}")]
    Netns(#[from] ambit_netns::NetnsError),
}

/// The command to run `argv` in `pod` (`NAME` or `NAMESPACE/NAME`). The environment is
/// `base_env` plus the pod's container env.
pub fn command(
    run: &RunDir,
    pod: &str,
    argv: &[String],
    base_env: &[(String, String)],
) -> Result<Command, ExecError> {
    let state = run
        .load()?
        .ok_or_else(|| ExecError::NoMesh(run.root().to_path_buf()))?;
    let (name, netns, env) = match (state.pod(pod), state.vm(pod)) {
        (Some(p), _) => (&p.name, &p.netns, &p.env),
        (None, Some(v)) => (&v.name, &v.netns, &v.env),
        (None, None) => {
            return Err(ExecError::UnknownPod {
                pod: pod.to_owned(),
                known: state
                    .pods
                    .iter()
                    .map(|p| format!("{}/{}", p.namespace, p.name))
                    .chain(
                        state
                            .vms
                            .iter()
                            .map(|v| format!("{}/{} (VM)", v.namespace, v.name)),
                    )
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    };
    let (program, args) = argv.split_first().ok_or(ExecError::NoCommand)?;
    let mut cmd = Command::new(program);
    set_command_netns(&mut cmd, &NetnsFd::open(netns)?)?;
    cmd.args(args)
        .env_clear()
        .envs(base_env.iter().cloned())
        .env("HOSTNAME", name)
        .envs(env.iter().cloned());
    Ok(cmd)
}
