#!/bin/bash
# Records the squeue output of JobRecord and of the jobs holding a node (run in the spl sandbox).
set -u
cd "$(dirname "$0")/../../.."
eval "$(python -m slurm_chaos sandbox env --name "${SANDBOX:-spl}")"
D=${D:-/tmp/spl/fixtures}; mkdir -p $D; cd $D
REC='JobID:|,ArrayTaskID:|,HetJobID:|,UserId:|,UserName:|,Account:|,Partition:|,Reservation:|,OverSubscribe:|,NumNodes:|,NodeList:|,SubmitTime:|,EndTime:|,admin_comment:|'
# node1: a finished job, then two 1-CPU jobs sharing it; node2: an --exclusive job alone, its
# AdminComment set by an administrator, its name a trap; node3: a job holding both CPUs without
# --exclusive; node4: an array of two 1-CPU tasks.
A=$(sbatch --parsable -N1 -n1 -w node1 --wrap 'true')
sleep 3
B=$(sbatch --parsable -N1 -n1 -w node1 -t 10 --wrap 'sleep 120')
C=$(sbatch --parsable -N1 -n1 -w node1 -t 10 --wrap 'sleep 120')
E=$(sbatch --parsable --hold -N1 --exclusive -w node2 -t 10 -J 'x AdminComment=slurm-chaos=evil|y' --wrap 'sleep 120')
scontrol update JobId=$E AdminComment=slurm-chaos=netem:delay=0.005s
scontrol release $E
F=$(sbatch --parsable -N1 -n2 -w node3 --wrap 'sleep 120')
G=$(sbatch --parsable -N1 -n1 -w node4 -t 10 --array=1-2 --wrap 'sleep 120')
for i in $(seq 1 60); do
  n=$(squeue -h -t R | wc -l); [ "$n" -ge 6 ] && break; sleep 1
done
echo "jobs A=$A B=$B C=$C E=$E F=$F G=$G" > jobs.txt
squeue -h -t all -o '%i %A %T %N %h' >> jobs.txt
squeue --noheader --states=all --nodelist=node1 --Format='JobID:|,State:|' > squeue_node_jobs_shared.txt
squeue --noheader --states=all --nodelist=node2 --Format='JobID:|,State:|' > squeue_node_jobs_exclusive.txt
squeue --noheader --jobs=$B,$E,$F,$G --Format="$REC" > squeue_job_record.txt
scontrol -o show job $E > scontrol_show_job_exclusive.txt
scontrol -o show job $F > scontrol_show_job_all_cpus.txt
scancel $B $C $E $F $G
ls -la $D; head -50 $D/*.txt
