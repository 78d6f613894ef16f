"""Reference solution of ini-change-port (never shown to the agent); runs in the workspace."""
# ruff: noqa: SIM115

import configparser

cp = configparser.ConfigParser()
cp.read("app.ini")
cp["server"]["port"] = "8080"
cp["server"]["workers"] = "4"
cp["logging"]["level"] = "warning"
with open("app.ini", "w") as fh:
    cp.write(fh)
