# pixi as prefix-dev releases it (see pixi-release.toml for why not nixpkgs' pixi).
{ pkgs, system }:
let
  release = builtins.fromTOML (builtins.readFile ./pixi-release.toml);
  artifact = release.${system} or (throw "nix/pixi-release.toml has no pixi release for ${system}; the nix shell supports x86_64-linux");
in
pkgs.stdenvNoCC.mkDerivation {
  pname = "pixi";
  inherit (release) version;
  src = pkgs.fetchurl { inherit (artifact) url sha256; };
  sourceRoot = ".";
  # a static binary: nothing to patch or strip
  dontPatchELF = true;
  dontStrip = true;
  installPhase = ''
    install -Dm755 pixi $out/bin/pixi
  '';
  doInstallCheck = true;
  installCheckPhase = ''
    [ "$($out/bin/pixi --version)" = "pixi ${release.version}" ]
  '';
  meta = {
    description = "pixi ${release.version}, prefix-dev's release binary";
    homepage = "https://pixi.sh";
    license = pkgs.lib.licenses.bsd3;
    sourceProvenance = [ pkgs.lib.sourceTypes.binaryNativeCode ];
    mainProgram = "pixi";
    platforms = [ system ];
  };
}
