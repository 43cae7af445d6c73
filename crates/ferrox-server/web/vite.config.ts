import { defineConfig } from "vite";
import { viteSingleFile } from "vite-plugin-singlefile";

// One self-contained HTML file (scripts and styles inlined, nothing fetched from elsewhere),
// which ferrox serve embeds in its binary and serves at `/`.
export default defineConfig({
  plugins: [viteSingleFile()],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2020",
  },
});
