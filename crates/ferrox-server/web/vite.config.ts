import { defineConfig } from "vite";

// The page as three files with fixed names (index.html, assets/app.js, assets/app.css),
// which ferrox serve embeds in its binary and serves at `/` and `/assets/`. Script and
// styles are separate files, not inlined, so the page runs under a Content-Security-Policy
// without 'unsafe-inline'.
export default defineConfig({
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2020",
    // Every browser this targets has modulepreload; the polyfill would only add code.
    modulePreload: { polyfill: false },
    rolldownOptions: {
      output: {
        // One script: a dynamic import would become a chunk the server does not serve.
        codeSplitting: false,
        entryFileNames: "assets/app.js",
        assetFileNames: "assets/app[extname]",
      },
    },
  },
});
