#!/bin/sh
# Copy the vendored files out of node_modules after `npm install` (versions: package.json,
# exact tarballs and hashes: package-lock.json). The console serves only the copies.
set -eu
cd "$(dirname "$0")"
cp node_modules/htmx.org/dist/htmx.min.js htmx.min.js
cp node_modules/htmx.org/LICENSE LICENSE.htmx
cp node_modules/uplot/dist/uPlot.iife.min.js uPlot.iife.min.js
cp node_modules/uplot/dist/uPlot.min.css uPlot.min.css
cp node_modules/uplot/LICENSE LICENSE.uplot
