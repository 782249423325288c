#!/bin/bash
# Records real Slurm 22.05 output from a running cluster into $D (default: this script's folder).
# SLURM_CONF must name the cluster (e.g. `eval $(slurm-chaos sandbox env)`); C is its shared directory.
set -u
C=${C:-/tmp/h-slurm-ref}
export SLURM_CONF=${SLURM_CONF:-$C/etc/slurm.conf}
D=${D:-$(cd "$(dirname "$0")" && pwd)}
mkdir -p $D
mkdir -p $C/jobs && cd $C/jobs
sinfo --version > $D/sinfo_version.txt
# reservation on node[3-4], drain node4
scontrol create reservation ReservationName=maint Nodes=node[3-4] Users=root StartTime=now Duration=120 Flags=MAINT,IGNORE_JOBS
scontrol update NodeName=node4 State=DRAIN Reason="h-slurm: disk check failed"
# jobs
sbatch --parsable -N2 -J two-node --wrap 'srun hostname; sleep 300' > $D/sbatch_parsable.txt
sbatch --parsable -N2 --switches=1 -J "leaf switch" --wrap 'srun hostname; sleep 300' >/dev/null
sbatch --parsable -N1 -J failing --wrap 'exit 3' >/dev/null
sbatch --parsable -N1 -J ok --wrap 'echo done' >/dev/null
C=$(sbatch --parsable -N1 -J cancelled --wrap 'sleep 300'); 
R=$(sbatch --parsable -N1 --requeue -J requeued --reservation=maint --wrap 'sleep 300')
sbatch --parsable -N4 -J too-big --wrap 'hostname' >/dev/null
sbatch --parsable -N1 --array=1-2 -J arr --wrap 'sleep 200' >/dev/null
sleep 3
scancel $C
scontrol requeue $R
sleep 4
squeue --json > $D/squeue.json
squeue -h -a -o '%i|%j|%T|%r|%N|%P|%v|%V|%S|%e' > $D/squeue.format.txt
sinfo --json > $D/sinfo.json
sinfo -h -N -o '%N|%T|%E|%u|%H|%f|%o|%n' > $D/sinfo.format.txt
scontrol show node > $D/scontrol_show_node.txt
scontrol -o show node > $D/scontrol_show_node_oneliner.txt
scontrol -o show job > $D/scontrol_show_job_oneliner.txt
scontrol show job $R > $D/scontrol_show_job.txt
scontrol show reservation > $D/scontrol_show_reservation.txt
scontrol -o show reservation > $D/scontrol_show_reservation_oneliner.txt
scontrol show hostnames 'node[1-3],gpu[01-03,10],login' > $D/scontrol_show_hostnames.txt
scontrol show hostlist node1,node2,node3,node5,gpu01,gpu02 > $D/scontrol_show_hostlist.txt
sleep 4
sacct --json -D -X > $D/sacct.json
sacct --parsable2 -D -X -o JobID,JobName,State,ExitCode,NodeList,Elapsed,Start,End,Partition,Reservation > $D/sacct.parsable2.txt
sacct --parsable2 -D -o JobID,JobName,State,ExitCode,NodeList,Elapsed,Start,End,Partition,Reservation > $D/sacct_steps.parsable2.txt
sbatch -N1 --partition=nosuch --wrap hostname 2> $D/sbatch_rejected_partition.stderr; echo "rc=$?" >> $D/sbatch_rejected_partition.stderr
sbatch -N9 --wrap hostname 2> $D/sbatch_rejected_nodes.stderr; echo "rc=$?" >> $D/sbatch_rejected_nodes.stderr
