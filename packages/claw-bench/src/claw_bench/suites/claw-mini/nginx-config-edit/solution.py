"""Reference solution of nginx-config-edit (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

c = open("nginx.conf").read()
c = c.replace("old.example.com", "new.example.com").replace("listen 80;", "listen 8080;\n    gzip on;")
open("nginx.conf", "w").write(c)
