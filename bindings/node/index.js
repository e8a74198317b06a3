// Entry of the sessionlog Node addon: the module the harness's suites load
// (SESSIONLOG_BACKEND=.../bindings/node/index.js). `npm run build` puts the
// compiled addon beside this file as sessionlog.node.
'use strict'
module.exports = require('./sessionlog.node')
