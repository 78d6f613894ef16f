#!/bin/bash
echo "hello, harbor" > hello.txt
