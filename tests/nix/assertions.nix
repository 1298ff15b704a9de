# What gptforge's flake.nix asks of buildFHSEnv, evaluated against the stand-in nixpkgs.
#   nix-instantiate --eval --strict --json assertions.nix --argstr flakeDir DIR
# gives a list of { name, ok } that tests/nix/harness.py counts.
{ flakeDir }:
let
  inherit (builtins)
    all
    any
    elem
    filter
    fromTOML
    head
    isString
    match
    readFile
    split
    ;

  system = "x86_64-linux";
  standIn = (import ./stand-in/flake.nix).outputs { self = standIn; };
  pkgs = standIn.legacyPackages.${system};
  flake = (import (flakeDir + "/flake.nix")).outputs {
    self = flake;
    nixpkgs = standIn;
  };

  shell = flake.packages.${system}.gptforge-shell;
  pixi = flake.packages.${system}.pixi;
  release = fromTOML (readFile (flakeDir + "/nix/pixi-release.toml"));
  inherit (shell) args;

  lines = s: filter isString (split "\n" s);
  # the first capture group of `re` on the first line it matches, or null
  capture =
    re: s:
    let
      hits = filter (m: m != null) (map (match re) (lines s));
    in
    if hits == [ ] then null else head (head hits);

  targets = map (p: p.drvPath) (args.targetPkgs pkgs);
  ldLibraryPath = filter isString (split ":" (capture " *export LD_LIBRARY_PATH=([^ ]*) *" args.profile));
  pathExport = capture " *export PATH=([^ ]*) *" args.profile;
  # the directory host-driver.sh is told to bind the driver into
  driverRoot = capture ".*-host-driver.sh ([^ )]+).*" args.extraPreBwrapCmds;
  hostDriverScript = "${/. + flakeDir + "/nix/host-driver.sh"}";
  bindArrays = map (a: capture "\"[$][{]([a-z_]+)\\[@]}\"" a) args.extraBwrapArgs;
  underHostSystem = d: any (p: match "${p}(/.*)?" d != null) [ "/usr" "/lib" "/lib64" "/lib32" "/bin" "/sbin" "/etc" ];

  check = name: ok: { inherit name ok; };
in
[
  (check "the dev shell is the sandbox's interactive env" (
    flake.devShells.${system}.default.drvPath == shell.env.drvPath
  ))
  (check "nix run .#gptforge-shell and .#default run the sandbox wrapper" (
    shell.meta.mainProgram == "gptforge-shell" && flake.packages.${system}.default.drvPath == shell.drvPath
  ))
  (check "the sandbox runs bash, so `-- -c CMD` runs CMD" (args.runScript == "bash"))
  (check "the sandbox holds the flake's pixi" (elem pixi.drvPath targets))
  (check "the flake's pixi is prefix-dev's release of nix/pixi-release.toml" (
    pixi.version == release.version
    && pixi.src.url == release.${system}.url
    && pixi.src.outputHash == release.${system}.sha256
  ))
  (check "the sandbox holds git, certificates and a C compiler" (
    all (n: elem pkgs.${n}.drvPath targets) [ "git" "cacert" "gcc" ]
  ))
  (check "no unfree package: pixi's licence is free" pixi.meta.license.free)
  (check "TLS certificates come from nixpkgs' cacert unless the user sets SSL_CERT_FILE" (
    capture ".*SSL_CERT_FILE=[$][{]SSL_CERT_FILE:-(.*)}.*" args.profile
    == "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt"
  ))
  (check "the host's driver is found by nix/host-driver.sh before bubblewrap starts" (
    capture "[^/]*(/[^ ]*-host-driver.sh) .*" args.extraPreBwrapCmds == hostDriverScript
  ))
  (check "the driver's files are bound read-only and nothing else is bound" (
    any (l: match ".*--ro-bind.*" l != null) (lines args.extraPreBwrapCmds)
    && all (l: match ".*--(bind|dev-bind|bind-try)[ =].*" l == null) (lines args.extraPreBwrapCmds)
  ))
  (check "extraBwrapArgs splices only arrays the pre-bwrap commands fill" (
    args.extraBwrapArgs != [ ]
    && all (a: a != null && any (l: match " *${a}(\\+?=).*" l != null) (lines args.extraPreBwrapCmds)) bindArrays
  ))
  (check "LD_LIBRARY_PATH starts with NixOS's driver directory" (
    ldLibraryPath != [ ] && head ldLibraryPath == "/run/opengl-driver/lib"
  ))
  (check "LD_LIBRARY_PATH holds the directory the host's driver is bound to" (
    driverRoot != null && elem "${driverRoot}/lib" ldLibraryPath
  ))
  (check "LD_LIBRARY_PATH holds nothing from /usr, /lib or an inherited value" (
    all (d: match "/.*" d != null && !(underHostSystem d) && match ".*[$].*" d == null) ldLibraryPath
  ))
  (check "nvidia-smi's bound directory comes first on PATH" (
    driverRoot != null && pathExport == "${driverRoot}/bin:$PATH"
  ))
  (check "the driver is bound outside the host's /run, /usr and /lib" (
    driverRoot != null && !(underHostSystem driverRoot) && match "/run(/.*)?" driverRoot == null
  ))
]
