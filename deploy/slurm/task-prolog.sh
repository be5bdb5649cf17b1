#!/bin/sh
# Slurm TaskProlog for whyslow (slurm.conf: TaskProlog=/etc/whyslow/task-prolog.sh).
# Slurm runs it before each task and applies every "export NAME=value" line
# it prints to the task's environment: the ranks then register with the
# node agent (WHYSLOW_AGENT_DIR), report to the server, and carry the job's
# Slurm identity (WHYSLOW_JOB_ID: the job id and name; docs/deploy.md).
# Site settings in /etc/whyslow/slurm.env: WHYSLOW_SERVER,
# WHYSLOW_TOKEN_FILE, WHYSLOW_AGENT_DIR. What the job set itself wins.
job_server=$WHYSLOW_SERVER
job_token=$WHYSLOW_TOKEN
job_agent_dir=$WHYSLOW_AGENT_DIR
job_id=$WHYSLOW_JOB_ID
conf=${WHYSLOW_SLURM_ENV:-/etc/whyslow/slurm.env}
[ -r "$conf" ] && . "$conf"
if [ -z "$job_agent_dir" ]; then
  dir=${WHYSLOW_AGENT_DIR:-/var/lib/whyslow/agent}
  [ -d "$dir" ] && echo "export WHYSLOW_AGENT_DIR=$dir"
fi
[ -z "$job_server" ] && [ -n "$WHYSLOW_SERVER" ] && echo "export WHYSLOW_SERVER=$WHYSLOW_SERVER"
if [ -z "$job_token" ] && [ -n "$WHYSLOW_TOKEN_FILE" ] && [ -r "$WHYSLOW_TOKEN_FILE" ]; then
  echo "export WHYSLOW_TOKEN=$(head -n 1 "$WHYSLOW_TOKEN_FILE")"
fi
if [ -z "$job_id" ] && [ -n "$SLURM_JOB_ID" ]; then
  # Job ids as whyslow names jobs: letters, digits, '.', '_' and '-'.
  name=$(printf '%s' "${SLURM_JOB_NAME:-job}" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-64)
  echo "export WHYSLOW_JOB_ID=slurm-${SLURM_JOB_ID}-${name}"
fi
exit 0
