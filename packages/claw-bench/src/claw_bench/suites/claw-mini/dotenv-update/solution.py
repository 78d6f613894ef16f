"""Reference solution of dotenv-update (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

out = []
for line in open(".env").read().splitlines():
    if line.startswith("DEBUG="):
        continue
    out.append("DB_HOST=db.internal" if line.startswith("DB_HOST=") else line)
out.append("LOG_LEVEL=info")
open(".env", "w").write("\n".join(out) + "\n")
