#!/bin/bash
[ "$(cat hello.txt 2>/dev/null)" = "hello, harbor" ]
