#!/usr/bin/env python3
# emu_gemm2d.py — host-side check of gemm2d_kernel's index math (src/backend/cuda/gemm_prefill_2d.cu), for
# reviewing changes without a GPU: one block emulated at the register/fragment level (stage layout with the
# XOR swizzle, load_a's 4/8-bit unpacking, the B reads, PTX m16n8k16 fragment layouts, the per-group fold,
# STORE and SWIGLU epilogues, ragged token counts, the 8- and 16-warp layouts) against a direct matmul,
# plus the per-thread copy roles of load_stage (every chunk exactly once). Prints max errors (~1e-12).
# Usage: python3 tools/emu_gemm2d.py
import numpy as np
np.seterr(over='ignore')
rng = np.random.default_rng(1)

def perm16(l): return 8*(l>>3) + 2*((l>>2)&1) + ((l>>1)&1) + 4*(l&1)

def run(BITS, NTW, EPI, count, n_groups, rows_valid=128, WN=2):
    T = 8*WN*NTW; TW = 8*NTW; WB = 8*BITS; cols = 64*n_groups
    R = 128
    q = rng.integers(0, 1 << BITS, size=(R, cols))
    s = rng.uniform(-1, 1, size=(R, n_groups)); b = rng.uniform(-1, 1, size=(R, n_groups))
    x = rng.integers(-8, 8, size=(T, cols)).astype(float)
    x[count:] = 0  # zero-filled rows
    # packed weights: row bytes
    if BITS == 4:
        packed = np.zeros((R, cols // 2), dtype=np.uint8)
        for c in range(cols):
            packed[:, c // 2] |= (q[:, c] << (4 * (c & 1))).astype(np.uint8)
    else:
        packed = q.astype(np.uint8)
    # permuted activations
    xp = np.zeros_like(x)
    for c0 in range(0, cols, 16):
        for l in range(16):
            xp[:, c0 + l] = x[:, c0 + perm16(l)]
    xs = np.stack([x[:, 64*k:64*k+64].sum(1) for k in range(n_groups)], 1)
    wm_of = lambda w: w & 3
    wn_of = lambda w: w >> 2
    acc = np.zeros((4*WN, 32, 2, NTW, 4))
    for k in range(n_groups):
        # stage: weights [br][WB bytes], activations swizzled [r][128 B] as 64 halves (chunks of 8)
        sw = np.zeros((R, WB), dtype=np.uint8)
        for br in range(R):
            sw[br] = packed[br, k*WB:(k+1)*WB]
        sx = np.zeros((T, 64))
        for r in range(T):
            for c in range(8):
                dst = (c ^ (r & 7))
                sx[r, dst*8:dst*8+8] = xp[r, 64*k + c*8: 64*k + c*8 + 8] if r < count else 0
        sxs = np.array([xs[t, k] if t < count else 0 for t in range(T)])
        ssb = np.concatenate([s[:, k], b[:, k]])
        words = lambda br: [int.from_bytes(bytes(sw[br, 4*i:4*i+4]), 'little') for i in range(WB // 4)]
        for w in range(4*WN):
            wm, wn = wm_of(w), wn_of(w)
            if not (wn * TW < count): continue
            # per lane A fragments: A[mt][j][reg] as pairs (lo, hi) of values
            A = {}
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                for mt in range(2):
                    r0 = wm*32 + mt*16 + g
                    for j in range(4):
                        for h in range(2):
                            ww = words(r0 + 8*h)
                            if BITS == 4:
                                word = ww[2*tig + (j >> 1)]
                                if j & 1: word >>= 8
                                lo = (word & 0xF, (word >> 16) & 0xF)
                                hi = ((word >> 4) & 0xF, (word >> 20) & 0xF)
                            else:
                                v = ww[4*tig:4*tig+4]  # uint4 at r*64 + tig*16
                                xw, yw = (v[0], v[1]) if j < 2 else (v[2], v[3])
                                by = [(xw >> (8*i)) & 0xFF for i in range(4)] + [(yw >> (8*i)) & 0xFF for i in range(4)]
                                sel = [2, 3, 6, 7] if (j & 1) else [0, 1, 4, 5]  # __byte_perm 0x7632 / 0x5410
                                xb = [by[i] for i in sel]
                                lo = (xb[0], xb[2]); hi = (xb[1], xb[3])
                            A[(lane, mt, j, h)] = lo       # a0 (h=0) / a1 (h=1)
                            A[(lane, mt, j, 2 + h)] = hi   # a2 / a3
            for nt in range(NTW):
                # B fragments per lane
                Bf = {}
                for lane in range(32):
                    g, tig = lane >> 2, lane & 3
                    r = wn*TW + nt*8 + g
                    assert r & 7 == g
                    b0 = sx[r, ((2*tig) ^ g)*8: ((2*tig) ^ g)*8 + 8]
                    b1 = sx[r, ((2*tig+1) ^ g)*8: ((2*tig+1) ^ g)*8 + 8]
                    # mma j: (b0.x,b0.y),(b0.z,b0.w),(b1.x,b1.y),(b1.z,b1.w); each reg = 2 halves
                    Bf[lane] = [(b0[0:2], b0[2:4]), (b0[4:6], b0[6:8]), (b1[0:2], b1[2:4]), (b1[4:6], b1[6:8])]
                xsv = {lane: sxs[wn*TW + nt*8 + (lane & 3)*2: wn*TW + nt*8 + (lane & 3)*2 + 2] for lane in range(32)}
                for mt in range(2):
                    c4 = np.zeros((32, 4))
                    for j in range(4):
                        Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            a = [A[(lane, mt, j, i)] for i in range(4)]
                            Am[g, 2*t:2*t+2] = a[0]; Am[g+8, 2*t:2*t+2] = a[1]
                            Am[g, 2*t+8:2*t+10] = a[2]; Am[g+8, 2*t+8:2*t+10] = a[3]
                            bb = Bf[lane][j]
                            Bm[2*t:2*t+2, g] = bb[0]; Bm[2*t+8:2*t+10, g] = bb[1]
                        D = Am @ Bm
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            c4[lane] += [D[g, 2*t], D[g, 2*t+1], D[g+8, 2*t], D[g+8, 2*t+1]]
                    for lane in range(32):
                        g = lane >> 2
                        r0 = wm*32 + mt*16 + g
                        sc = [ssb[r0], ssb[r0+8]]; bi = [ssb[128+r0], ssb[128+r0+8]]
                        xx = xsv[lane]
                        acc[w, lane, mt, nt, 0] += sc[0]*c4[lane, 0] + bi[0]*xx[0]
                        acc[w, lane, mt, nt, 1] += sc[0]*c4[lane, 1] + bi[0]*xx[1]
                        acc[w, lane, mt, nt, 2] += sc[1]*c4[lane, 2] + bi[1]*xx[0]
                        acc[w, lane, mt, nt, 3] += sc[1]*c4[lane, 3] + bi[1]*xx[1]
    # reference: W[r][c] = s*q + b, Y[tok][r]
    Wd = np.zeros((R, cols))
    for kk in range(n_groups):
        Wd[:, 64*kk:64*kk+64] = s[:, kk:kk+1]*q[:, 64*kk:64*kk+64] + b[:, kk:kk+1]
    ref = x @ Wd.T  # [T][R]
    out = np.full((T, R), np.nan)
    if EPI == 'store':
        for w in range(4*WN):
            wm, wn = wm_of(w), wn_of(w)
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                for mt in range(2):
                    for h in range(2):
                        row = wm*32 + mt*16 + g + 8*h
                        for nt in range(NTW):
                            for jj in range(2):
                                tok = wn*TW + nt*8 + tig*2 + jj
                                if tok < count:
                                    assert np.isnan(out[tok, row])
                                    out[tok, row] = acc[w, lane, mt, nt, 2*h + jj]
        err = np.nanmax(np.abs(out[:count] - ref[:count]))
        assert not np.isnan(out[:count]).any() and np.isnan(out[count:]).all()
        return err
    else:  # swiglu: rows 0..63 gate, 64..127 up of the same local rows
        G = 64 * 1; S_g = np.full((64, T + 4), np.nan)
        for w in range(4*WN):
            wm, wn = wm_of(w), wn_of(w)
            if wm >= 2: continue
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                for mt in range(2):
                    for nt in range(NTW):
                        for i in range(4):
                            S_g[wm*32 + mt*16 + g + 8*(i >> 1), wn*TW + nt*8 + tig*2 + (i & 1)] = acc[w, lane, mt, nt, i]
        out = np.full((T, 64), np.nan)
        for w in range(4*WN):
            wm, wn = wm_of(w), wn_of(w)
            if wm < 2: continue
            for lane in range(32):
                g, tig = lane >> 2, lane & 3
                for mt in range(2):
                    for h in range(2):
                        rl = (wm - 2)*32 + mt*16 + g + 8*h
                        for nt in range(NTW):
                            for jj in range(2):
                                tok = wn*TW + nt*8 + tig*2 + jj
                                if tok < count:
                                    gv = S_g[rl, tok]; uv = acc[w, lane, mt, nt, 2*h + jj]
                                    assert np.isnan(out[tok, rl])
                                    out[tok, rl] = gv / (1 + np.exp(-gv)) * uv
        gref = ref[:, :64]; uref = ref[:, 64:]
        want = gref / (1 + np.exp(-gref)) * uref
        assert not np.isnan(out[:count]).any()
        return np.max(np.abs(out[:count] - want[:count]) / (1 + np.abs(want[:count])))

def coverage(BITS, WN, NTW):
    # per-thread copy roles of load_stage and the scale/bias staging: every chunk exactly once
    NTHR = 128*WN; T = 8*WN*NTW; CPR = (8*BITS)//16; WCH = 128*CPR; WPT = (WCH + NTHR - 1)//NTHR
    w_all = WPT*NTHR == WCH
    seen = {}
    for tid in range(NTHR):
        for i in range(WPT):
            q = tid + i*NTHR
            if not (w_all or q < WCH): continue
            br = q//CPR if w_all else (q//CPR) & 127; part = q % CPR
            dst = br*(8*BITS) + ((part ^ (br & 1)) if BITS == 16 else part)*16
            assert dst not in seen; seen[dst] = 1
    assert len(seen) == WCH
    xs = set()
    for tid in range(NTHR):
        for i in range(T*8//NTHR):
            q = tid + i*NTHR; r = q >> 3; c = q & 7
            key = r*128 + ((c ^ (r & 7))*16)
            assert key not in xs; xs.add(key)
    assert len(xs) == T*8 and T*8 % NTHR == 0
    sb = [tid for tid in range(NTHR) if NTHR == 256 or tid < 256]
    assert sorted(sb) == list(range(256))
for BITS in (4, 8, 16):
    for WN, NTW in ((2, 4), (2, 8), (4, 4)):
        coverage(BITS, WN, NTW)
print("coverage ok")
for WN, BITS, NTW, EPI, count, ng in [(4, 4, 4, 'store', 128, 2), (4, 4, 4, 'store', 97, 1), (4, 4, 4, 'swiglu', 128, 3), (4, 4, 4, 'swiglu', 33, 2)]:
    print("WN", WN, BITS, NTW, EPI, count, ng, "max err", run(BITS, NTW, EPI, count, ng, WN=WN))
for BITS, NTW, EPI, count, ng in [(4, 8, 'store', 128, 2), (4, 8, 'store', 70, 1), (4, 4, 'store', 64, 2), (4, 8, 'store', 3, 3),
                                  (8, 8, 'store', 100, 2), (8, 4, 'store', 33, 1), (4, 8, 'swiglu', 128, 2), (4, 4, 'swiglu', 40, 2)]:
    print(BITS, NTW, EPI, count, ng, "max err", run(BITS, NTW, EPI, count, ng))
