"""Reference solution of crontab-reschedule (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

t = open("crontab.txt").read()
t = t.replace("0 1 * * * /opt/bin/backup.sh", "30 2 * * * /opt/bin/backup.sh")
t = t.replace("0 4 * * 0 /opt/bin/cleanup.sh", "# 0 4 * * 0 /opt/bin/cleanup.sh")
open("crontab.txt", "w").write(t + "0 7 * * 1 /opt/bin/report.sh\n")
