import os

# TODO: read config from env
def main():
    pass  # TODO: implement main
