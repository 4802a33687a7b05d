#!/bin/bash
# fixture stand-in for the generated eval script
set -uxo pipefail
